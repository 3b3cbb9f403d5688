"""bench/trainer.py compares equal work: on the same pre-built batch from the same weights, our update
and TRL's GRPOTrainer update see the same tokens and produce the same gradient (norm) — so the
speed ratio it reports is the trainers', not a difference of work. Runs the benchmark's own code
at the smallest size (one pair, one timed update)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl", reason="needs trl (dev extra)")


def test_ours_and_trls_updates_do_the_same_work_on_the_same_batch(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.trainer import main

    out = main(["--pairs", "1", "--steps", "1", "--prompts", "2", "--group", "2", "--prompt-len", "8",
                "--completion-len", "4"])
    check = out["same_work_check"]
    assert check["tokens_per_pair_each_side"] == 2 * 2 * (8 + 4)  # one timed update, counted on both sides
    assert check["updates_per_pair_each_side"] == 1
    assert check["first_grad_norm"]["ours"] > 0
    assert check["first_grad_norm"]["max_rel_diff"] < 1e-4
    assert check["first_loss"]["max_abs_diff"] < 1e-6
    assert out["speedup"]["pairs"] == 1 and out["speedup"]["min"] <= out["speedup"]["median"] <= out["speedup"]["max"]
    assert "window" in out and "excluded on both" in out["window"]
    for side in ("ours", "trl"):  # where the time goes, per side
        ops = out["profile"][side]["top_ops"]
        assert ops and all(0 < op["share"] <= 1 for op in ops)
        assert [op["self_ms"] for op in ops] == sorted((op["self_ms"] for op in ops), reverse=True)
    assert capsys.readouterr().out.count("\n") == 1  # ONE JSON object on stdout
