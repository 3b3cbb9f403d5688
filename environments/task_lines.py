"""Tasks that are payloads (the browser, chat, read_number and openenv kinds) as Crucible JSONL: one object a line,

    {"id": "refund-1", "instruction": "My order came broken.", "split": "train", "payload": {"follow_ups": ["Thanks!"]}}
    {"id": "rn-42", "instruction": "The file number.txt holds a number. Read it and submit it.",
     "payload": {"path": "number.txt", "number": "42"}}

The payload is checked by the kind's own task parser (`parse_task`, the one the worker runs), so a task
that imports is a task an episode can play. `split` defaults to train; the instruction to what the kind
can say from the payload (a browser page's goal, read_number's sentence), else it is required (a chat
task's first message). Every problem is one line naming the line and the field; a bad line anywhere
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

EXAMPLES = {
    "browser": '{"family": "miniwob", "name": "click-button", "seed": 0}',
    "chat": '{"follow_ups": ["And in French?"]}',
    "read_number": '{"path": "number.txt", "number": "42"}',
    "openenv": '{"seed": 3, "options": {}}',
}
"""The kinds whose tasks are payloads, each with a payload to show in an error."""
PAYLOAD_KINDS = tuple(EXAMPLES)
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


def parse_payload(kind: str, payload: dict[str, Any], where: str) -> Any:
    """The kind's task from `payload`, or one line naming the first field that is wrong."""
    from environments.registry import get_kind

    try:
        return get_kind(kind).parse_task(payload)
    except ValidationError as error:
        first = error.errors()[0]
        loc, message = ".".join(map(str, first["loc"])), first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{where}: payload{'.' + loc if loc else ''}: {message}") from None


def default_instruction(kind: str, task: Any) -> str | None:
    """What the instruction is when a line leaves it out; None: the kind cannot say, the line must."""
    if kind == "browser":
        return task.goal or f"MiniWoB++ task {task.name} (seed {task.seed}); the page states the goal."  # type: ignore[no-any-return]
    if kind == "read_number":
        from environments.read_number.task import instruction_for

        return instruction_for(task)
    if kind == "openenv":  # the environment's first observation follows it
        return "Act in the environment." if task.seed is None else f"Act in the environment (instance {task.seed})."
    return None


def payload_records(lines: Iterable[tuple[int, str, dict[str, Any]]], *, kind: str) -> Iterator[TaskRecord]:
    """A record for each line (what `code_repo.importing.json_lines` yields) of a `kind` environment's JSONL."""
    if kind not in EXAMPLES:
        raise ConfigError(f"environment kind: expected one of {', '.join(PAYLOAD_KINDS)} for payload tasks, got {kind!r}")
    for _, where, data in lines:
        extra = sorted(set(data) - set(KEYS))
        if extra:
            raise ConfigError(f"{where}: expected only {', '.join(KEYS[:-1])} and {KEYS[-1]}, got {extra[:5]}")
        external_id = line_text(data, "id", where, limit=MAX_ID_CHARS)
        if not isinstance(data.get("payload"), dict):
            raise ConfigError(f"{where}: payload: expected a {kind} task object like {EXAMPLES[kind]}, "
                              f"got {data.get('payload')!r:.80}")
        task = parse_payload(kind, data["payload"], where)
        instruction = line_text(data, "instruction", where, limit=MAX_INSTRUCTION_CHARS,
                                default=default_instruction(kind, task))
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
