"""Tasks that are payloads (every kind with an `example` payload: browser, chat, read_number, openenv) as
Crucible JSONL, one object a line,

    {"id": "refund-1", "instruction": "My order came broken.", "split": "train", "payload": {"follow_ups": ["Thanks!"]}}
    {"id": "rn-42", "instruction": "The file number.txt holds a number. Read it and submit it.",
     "payload": {"path": "number.txt", "number": "42"}}

The payload is checked by the kind's own task parser (`parse_task`, the one the worker runs), so a task
that imports is a task an episode can play. `split` defaults to train; the instruction to what the kind
can say from the payload (its `default_instruction`: a browser page's goal, read_number's sentence), else
it is required (a chat task's first message). Every problem is one line naming the line and the field; a bad line anywhere
stores nothing (the caller's transaction).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.errors import ConfigError
from environments.code_repo.importing import (
    MAX_ID_CHARS,
    MAX_INSTRUCTION_CHARS,
    MAX_SPLIT_CHARS,
    TaskRecord,
    json_lines,
)

KEYS = ("id", "instruction", "split", "payload")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_split(split: str) -> str:
    if not split.strip() or len(split) > MAX_SPLIT_CHARS or _CONTROL.search(split):
        raise ConfigError(f"split: expected a name of 1 to {MAX_SPLIT_CHARS} printable characters, got {split[:80]!r}")
    return split


def line_text(data: dict[str, Any], key: str, where: str, *, limit: int, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key}: expected a non-empty string, got {value!r:.80}")
    if len(value) > limit:
        raise ConfigError(f"{where}: {key}: expected at most {limit} characters, got {len(value)}")
    return value


def payload_kinds() -> list[str]:
    """The kinds whose tasks are payload lines: those with an `example` payload."""
    from environments.registry import get_kind, kind_names

    return [name for name in kind_names() if get_kind(name).example is not None]


def parse_payload(kind: str, payload: dict[str, Any], where: str) -> Any:
    """The kind's task from `payload`, or one line naming the first field that is wrong."""
    from environments.registry import get_kind

    try:
        return get_kind(kind).parse_task(payload)
    except ValidationError as error:
        first = error.errors()[0]
        loc, message = ".".join(map(str, first["loc"])), first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{where}: payload{'.' + loc if loc else ''}: {message}") from None


def payload_records(lines: Iterable[tuple[int, str, dict[str, Any]]], *, kind: str) -> Iterator[TaskRecord]:
    """A record for each line (what `code_repo.importing.json_lines` yields) of a `kind` environment's JSONL."""
    from environments.registry import get_kind

    if kind not in payload_kinds():
        raise ConfigError(f"environment kind: expected one of {', '.join(payload_kinds())} for payload tasks, "
                          f"got {kind!r}")
    kind_class = get_kind(kind)
    for _, where, data in lines:
        extra = sorted(set(data) - set(KEYS))
        if extra:
            raise ConfigError(f"{where}: expected only {', '.join(KEYS[:-1])} and {KEYS[-1]}, got {extra[:5]}")
        external_id = line_text(data, "id", where, limit=MAX_ID_CHARS)
        if not isinstance(data.get("payload"), dict):
            raise ConfigError(f"{where}: payload: expected a {kind} task object like {kind_class.example}, "
                              f"got {data.get('payload')!r:.80}")
        task = parse_payload(kind, data["payload"], where)
        instruction = line_text(data, "instruction", where, limit=MAX_INSTRUCTION_CHARS,
                                default=kind_class.default_instruction(task))
        split = check_split(line_text(data, "split", where, limit=MAX_SPLIT_CHARS, default="train"))
        yield TaskRecord(external_id, instruction, split, task.model_dump(mode="json"))


def read_payload_file(path: Path, *, kind: str) -> list[TaskRecord]:
    """Client side: a local JSONL file of a `kind` environment's tasks."""
    try:
        with path.open(encoding="utf-8", errors="strict", newline="") as handle:
            return list(payload_records(json_lines(handle, source=str(path)), kind=kind))
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the task file ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: expected UTF-8 JSONL, got a byte that is not at {error.start}") from None
