"""`crucible rm train`, run as a user runs it (a subprocess): on the synthetic preference set (the
preferred response gives the number the prompt asks for) the tiny model learns the rule to a held-out
pairwise accuracy of at least 0.9, and the saved model ranks fresh pairs the same way through `score`;
a hostile pairs file or option is one red line and exit code 2, with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.reward_model import score
from trainer.synthetic_preferences import make_pairs, write_jsonl

ROOT = Path(__file__).parents[2]


def _crucible(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}  # one thread: the cores are shared
    return subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


# ~35 s alone on one thread (1,000 pairs, 8 epochs, 400 steps); on a loaded 2-core machine 2-3x that.
@pytest.mark.slow
def test_rm_train_learns_the_synthetic_rule_to_at_least_0_9_held_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    write_jsonl(make_pairs(1000, seed=0), tmp_path / "prefs.jsonl")
    out = tmp_path / "rm"
    result = _crucible("rm", "train", "--pairs", str(tmp_path / "prefs.jsonl"), "--model", str(tiny_model_dir),
                       "--out", str(out), "--epochs", "8", "--lr", "1e-3", "--seed", "0", "--held-out", "0.2",
                       "-o", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert (report["train_pairs"], report["held_out_pairs"], report["steps"]) == (800, 200, 400)
    assert report["held_out_accuracy"] >= 0.9, report
    assert report["held_out_loss"] < report["first_train_loss"]

    torch.set_num_threads(1)
    fresh = make_pairs(40, seed=12345)  # never seen: another seed
    right = sum(score(out, p.prompt, p.chosen) > score(out, p.prompt, p.rejected) for p in fresh)
    assert right >= 0.9 * len(fresh)


def test_rm_train_prints_one_table_line_set_and_refuses_a_used_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    write_jsonl(make_pairs(20, seed=0), tmp_path / "prefs.jsonl")
    args = ("rm", "train", "--pairs", str(tmp_path / "prefs.jsonl"), "--model", str(tiny_model_dir),
            "--out", str(tmp_path / "rm"), "--epochs", "1", "--held-out", "0.25", "--max-tokens", "64")
    result = _crucible(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"reward model {tmp_path / 'rm'}: held-out pairwise accuracy" in result.stdout
    assert "trained on 15 pairs: 1 epochs, 1 steps" in result.stdout
    again = _crucible(*args)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.strip().splitlines() == [
        f"error: --out: expected a new or empty directory, got {tmp_path / 'rm'} with files in it"]


@pytest.mark.parametrize(("content", "options", "expected"), [
    (b'{"prompt": "Say 3.", "chosen": "3", "rejected": "4"}\n{"prompt": "Say 3.", "chosen": "\\u001b[2J", '
     b'"rejected": 4}\n', (), "line 2: field 'rejected': expected a string, got int 4"),
    (b"", (), "expected at least 2 pairs (one to train on, one held out), got 0"),
    (b'{"prompt": "Say 3.", "chosen": "3", "rejected": "4"}\n' * 3, ("--held-out", "1.5"),
     "--held-out: expected a fraction strictly between 0 and 1, got 1.5"),
    (b'{"prompt": "Say 3.", "chosen": "3", "rejected": "4"}\n' * 3, ("--lr", "nan"),
     "--lr: expected a learning rate in (0, 1], got nan"),
])
def test_a_hostile_pairs_file_or_option_is_one_line_and_exit_2(
    tiny_model_dir: Path, tmp_path: Path, content: bytes, options: tuple[str, ...], expected: str,
) -> None:
    (tmp_path / "prefs.jsonl").write_bytes(content)
    result = _crucible("rm", "train", "--pairs", str(tmp_path / "prefs.jsonl"), "--model", str(tiny_model_dir),
                       "--out", str(tmp_path / "rm"), *options)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert not (tmp_path / "rm").exists()
