"""Preference pairs for a Bradley–Terry reward model: read from JSONL, every line checked, and split.

    pairs = load_pairs_jsonl(Path("prefs.jsonl"))           # one {"prompt", "chosen", "rejected"} a line
    train, held_out = split_pairs(pairs, held_out=0.2, seed=0)
    check_fit_options(epochs=3, lr=1e-3, batch_size=16, max_tokens=512, out_dir=Path("rm"))

The file comes from outside (an export, a stranger's data set), so each line is refused with one line
that names its number, the field, what was expected and what was given: invalid JSON or UTF-8, not
an object, a missing, non-string or blank field, chosen equal to rejected, a line over
MAX_LINE_BYTES. Other keys (an `id`, a `source`) are ignored. Blank lines are skipped. The fit's
options are checked here too, without torch, so that `crucible rm train` refuses them before it loads it.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from trainer.errors import PreferenceDataError

FIELDS = ("prompt", "chosen", "rejected")
MAX_LINE_BYTES = 1_000_000  # a pair is text a model reads: a megabyte line is a wrong file, not a pair
MAX_PAIRS = 1_000_000


@dataclass(frozen=True)
class PreferencePair:
    """`chosen` is the response preferred to `rejected` for `prompt`."""

    prompt: str
    chosen: str
    rejected: str


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_pair(line: bytes, *, number: int, source: str) -> PreferencePair:
    """One JSONL line as a pair, or PreferenceDataError naming `source:number`, the field and the value."""
    where = f"{source} line {number}"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PreferenceDataError(f"{where}: expected UTF-8 text, got an invalid byte at offset {error.start}") \
            from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise PreferenceDataError(f"{where}: expected a JSON object, got invalid JSON ({error.msg}, column "
                                  f"{error.colno})") from None
    if not isinstance(record, dict):
        raise PreferenceDataError(f"{where}: expected a JSON object with {', '.join(FIELDS)}, "
                                  f"got a {type(record).__name__} {_shown(record)}")
    values = {}
    for field in FIELDS:
        if field not in record:
            raise PreferenceDataError(f"{where}: field {field!r}: expected a string, got nothing (missing)")
        value = record[field]
        if not isinstance(value, str):
            raise PreferenceDataError(f"{where}: field {field!r}: expected a string, "
                                      f"got {type(value).__name__} {_shown(value)}")
        if not value.strip():
            raise PreferenceDataError(f"{where}: field {field!r}: expected non-blank text, got {_shown(value)}")
        values[field] = value
    if values["chosen"] == values["rejected"]:
        raise PreferenceDataError(f"{where}: field 'rejected': expected a response different from 'chosen', "
                                  f"got the same text {_shown(values['chosen'])}")
    return PreferencePair(**values)


def load_pairs_jsonl(path: Path) -> list[PreferencePair]:
    """Every pair in `path`; the first bad line stops the load (a half-read data set trains the wrong model)."""
    path = Path(path)
    if not path.is_file():
        raise PreferenceDataError(f"--pairs: expected a JSONL file, got {path} ("
                                  f"{'a directory' if path.is_dir() else 'no such file'})")
    pairs: list[PreferencePair] = []
    with path.open("rb") as stream:
        number = 0
        while True:
            # readline with a limit: a file that is one 10 GB line is refused without being read whole
            line = stream.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise PreferenceDataError(f"{path} line {number}: expected at most {MAX_LINE_BYTES} bytes, "
                                          f"got more")
            if not line.strip():
                continue
            if len(pairs) >= MAX_PAIRS:
                raise PreferenceDataError(f"{path}: expected at most {MAX_PAIRS} pairs, got more")
            pairs.append(parse_pair(line, number=number, source=str(path)))
    if len(pairs) < 2:
        raise PreferenceDataError(f"{path}: expected at least 2 pairs (one to train on, one held out), "
                                  f"got {len(pairs)}")
    return pairs


def split_pairs(pairs: list[PreferencePair], *, held_out: float, seed: int,
                ) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, held-out): a seeded shuffle, then the last `held_out` share (at least one pair each side)."""
    if not 0.0 < held_out < 1.0:
        raise PreferenceDataError(f"--held-out: expected a fraction strictly between 0 and 1, got {held_out}")
    if len(pairs) < 2:
        raise PreferenceDataError(f"expected at least 2 pairs to split, got {len(pairs)}")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_held = min(len(pairs) - 1, max(1, round(len(pairs) * held_out)))
    shuffled = [pairs[i] for i in order]
    return shuffled[:-n_held], shuffled[-n_held:]


def check_fit_options(*, epochs: int, lr: float, batch_size: int, max_tokens: int, out_dir: Path) -> None:
    """The options of a reward model's fit (trainer.reward_model.train_reward_model), each refused in one line."""
    if epochs < 1:
        raise ConfigError(f"--epochs: expected at least 1, got {epochs}")
    if not (math.isfinite(lr) and 0.0 < lr <= 1.0):
        raise ConfigError(f"--lr: expected a learning rate in (0, 1], got {lr}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size: expected at least 1, got {batch_size}")
    if max_tokens < 8:
        raise ConfigError(f"--max-tokens: expected at least 8, got {max_tokens}")
    check_out_dir(out_dir)


def check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"--out: expected a new or empty directory, got {out_dir} with files in it")
