"""The Bradley–Terry reward model's pieces on the real tiny model: the JSONL loader refuses every
hostile line with one line naming it, the split is seeded, a short training run saves a directory that
`score` reads back to the very rewards training measured, and a bad option or a used `--out` is refused
before anything is written. (Learning the synthetic rule to ≥ 0.9 is tests/cli/test_rm.py.)"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from core.errors import ConfigError
from trainer.errors import PreferenceDataError
from trainer.preference_pairs import MAX_LINE_BYTES, PreferencePair, load_pairs_jsonl, split_pairs
from trainer.reward_model import (
    CONFIG_FILE,
    HEAD_FILE,
    evaluate,
    load_reward_model,
    pair_rewards,
    score,
    train_reward_model,
)
from trainer.synthetic_preferences import make_pairs, write_jsonl

GOOD = '{"prompt": "Say 3.", "chosen": "3", "rejected": "4"}'


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the test machine's cores are shared
    yield
    torch.set_num_threads(before)  # other tests' processes compare with this one's count


def _file(tmp_path: Path, *lines: str | bytes) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


@pytest.mark.parametrize(("line", "expected"), [
    ('{"prompt": "Say 3.", "chosen": "3"', "line 2: expected a JSON object, got invalid JSON"),
    ("[1, 2, 3]", "line 2: expected a JSON object with prompt, chosen, rejected, got a list [1, 2, 3]"),
    ('"just text"', "line 2: expected a JSON object with prompt, chosen, rejected, got a str"),
    ("null", "got a NoneType null"),
    ('{"prompt": "Say 3.", "chosen": "3"}', "line 2: field 'rejected': expected a string, got nothing (missing)"),
    ('{"chosen": "3", "rejected": "4"}', "line 2: field 'prompt': expected a string, got nothing (missing)"),
    ('{"prompt": "Say 3.", "chosen": 3, "rejected": "4"}', "line 2: field 'chosen': expected a string, got int 3"),
    ('{"prompt": null, "chosen": "3", "rejected": "4"}', "field 'prompt': expected a string, got NoneType null"),
    ('{"prompt": "Say 3.", "chosen": ["3"], "rejected": "4"}', "field 'chosen': expected a string, got list"),
    ('{"prompt": "", "chosen": "3", "rejected": "4"}', "field 'prompt': expected non-blank text, got \"\""),
    ('{"prompt": "Say 3.", "chosen": " \\n\\t", "rejected": "4"}', "field 'chosen': expected non-blank text"),
    ('{"prompt": "Say 3.", "chosen": "3", "rejected": "3"}',
     "field 'rejected': expected a response different from 'chosen', got the same text \"3\""),
    (b'{"prompt": "Say \xff", "chosen": "3", "rejected": "4"}', "line 2: expected UTF-8 text, got an invalid byte"),
    ("NaN", "line 2: expected a JSON object with prompt, chosen, rejected, got a float NaN"),
])
def test_each_hostile_line_is_refused_naming_line_field_expected_and_given(
    tmp_path: Path, line: str | bytes, expected: str,
) -> None:
    path = _file(tmp_path, GOOD, line, GOOD)
    with pytest.raises(PreferenceDataError) as caught:
        load_pairs_jsonl(path)
    message = str(caught.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    huge = '{"prompt": "' + "x" * MAX_LINE_BYTES + '", "chosen": "3", "rejected": "4"}'
    with pytest.raises(PreferenceDataError, match=f"line 3: expected at most {MAX_LINE_BYTES} bytes, got more"):
        load_pairs_jsonl(_file(tmp_path, GOOD, GOOD, huge))


@pytest.mark.parametrize("lines", [(), ("", "  "), (GOOD,)])
def test_a_file_with_fewer_than_two_pairs_is_refused(tmp_path: Path, lines: tuple[str, ...]) -> None:
    with pytest.raises(PreferenceDataError, match=f"expected at least 2 pairs .*, got {len([x for x in lines if x.strip()])}"):
        load_pairs_jsonl(_file(tmp_path, *lines))


def test_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PreferenceDataError, match=r"expected a JSONL file, got .* \(no such file\)"):
        load_pairs_jsonl(tmp_path / "absent.jsonl")
    with pytest.raises(PreferenceDataError, match=r"expected a JSONL file, got .* \(a directory\)"):
        load_pairs_jsonl(tmp_path)


def test_blank_lines_and_extra_keys_are_ignored_and_text_is_kept_exactly(tmp_path: Path) -> None:
    prompt = "Ünïcode \u202e and [markup]"
    odd = {"prompt": prompt, "chosen": " a ", "rejected": "a", "id": 7, "source": None}
    pairs = load_pairs_jsonl(_file(tmp_path, GOOD, "", json.dumps(odd), "   "))
    assert pairs == [PreferencePair("Say 3.", "3", "4"), PreferencePair(prompt, " a ", "a")]


def test_the_split_is_seeded_disjoint_and_never_leaves_a_side_empty() -> None:
    pairs = make_pairs(50, seed=3)
    train, held = split_pairs(pairs, held_out=0.2, seed=5)
    assert (len(train), len(held)) == (40, 10) and sorted(map(id, train + held)) == sorted(map(id, pairs))
    assert (train, held) == split_pairs(pairs, held_out=0.2, seed=5)
    assert held != split_pairs(pairs, held_out=0.2, seed=6)[1]
    assert [len(side) for side in split_pairs(pairs[:2], held_out=0.01, seed=0)] == [1, 1]
    assert [len(side) for side in split_pairs(pairs[:2], held_out=0.99, seed=0)] == [1, 1]
    for bad in (0.0, 1.0, -0.5, 2.0, math.nan, math.inf):
        with pytest.raises(PreferenceDataError, match=f"--held-out: expected a fraction strictly between 0 and 1, got {bad}"):
            split_pairs(pairs, held_out=bad, seed=0)


def test_synthetic_pairs_differ_only_in_the_number(tmp_path: Path) -> None:
    pairs = make_pairs(200, seed=1)
    assert pairs == make_pairs(200, seed=1) and pairs != make_pairs(200, seed=2)
    for pair in pairs:
        assert len(pair.chosen) == len(pair.rejected) and pair.chosen != pair.rejected
        differing = [(a, b) for a, b in zip(pair.chosen, pair.rejected, strict=True) if a != b]
        asked = int("".join(c for c in pair.prompt if c.isdigit())) + ("after" in pair.prompt)
        assert len(differing) == 1 and differing[0][0] == str(asked)
    write_jsonl(pairs, tmp_path / "p.jsonl")
    assert load_pairs_jsonl(tmp_path / "p.jsonl") == pairs


def test_a_short_run_saves_a_model_that_scores_what_training_measured(tiny_model_dir: Path, tmp_path: Path) -> None:
    pairs = make_pairs(40, seed=0)
    out = tmp_path / "rm"
    report = train_reward_model(pairs=pairs, model_dir=tiny_model_dir, out_dir=out, epochs=1, lr=1e-3,
                                seed=0, held_out=0.25, batch_size=8, max_tokens=64)
    assert (report.train_pairs, report.held_out_pairs, report.steps) == (30, 10, 4)
    assert report.first_train_loss == pytest.approx(math.log(2))  # a zero head: every margin starts at 0
    assert math.isfinite(report.held_out_loss) and 0.0 <= report.held_out_accuracy <= 1.0
    assert {CONFIG_FILE, HEAD_FILE, "config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in out.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == ["rm"]  # the staging directory was renamed, not left
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["report"]["held_out_accuracy"] == report.held_out_accuracy and config["max_tokens"] == 64

    model, tokenizer, _ = load_reward_model(out)
    held = split_pairs(pairs, held_out=0.25, seed=0)[1]
    assert evaluate(model, tokenizer, held, max_tokens=64, batch_size=3) == pytest.approx(
        (report.held_out_loss, report.held_out_accuracy))
    with torch.no_grad():
        chosen, rejected = pair_rewards(model, tokenizer, held[:2], max_tokens=64)
    assert score(out, held[0].prompt, held[0].chosen) == pytest.approx(float(chosen[0]), abs=1e-5)
    assert score(out, held[1].prompt, held[1].rejected) == pytest.approx(float(rejected[1]), abs=1e-5)


def test_bad_options_and_a_used_out_directory_are_refused_before_anything_is_written(
    tiny_model_dir: Path, tmp_path: Path,
) -> None:
    pairs = make_pairs(10, seed=0)
    out = tmp_path / "rm"
    for options, expected in [
        ({"epochs": 0}, "--epochs: expected at least 1, got 0"),
        ({"lr": math.nan}, "--lr: expected a learning rate in (0, 1], got nan"),
        ({"lr": 0.0}, "--lr: expected a learning rate in (0, 1], got 0.0"),
        ({"batch_size": 0}, "--batch-size: expected at least 1, got 0"),
        ({"max_tokens": 2}, "--max-tokens: expected at least 8, got 2"),
    ]:
        with pytest.raises(ConfigError) as caught:
            train_reward_model(pairs=pairs, model_dir=tiny_model_dir, out_dir=out, **options)  # type: ignore[arg-type]
        assert str(caught.value) == expected
    with pytest.raises(ConfigError, match=r"--model: expected a model directory with config\.json"):
        train_reward_model(pairs=pairs, model_dir=tmp_path, out_dir=out)
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"--out: expected a new or empty directory, got .* with files in it"):
        train_reward_model(pairs=pairs, model_dir=tiny_model_dir, out_dir=out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    with pytest.raises(ConfigError, match=r"expected a reward model directory with reward_model\.json"):
        score(tiny_model_dir, "a", "b")
