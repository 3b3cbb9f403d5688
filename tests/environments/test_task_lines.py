"""Crucible JSONL for the kinds whose tasks are payloads (chat, read_number; browser's own tests are in
tests/environments/browser/test_importing.py), on the real Postgres: the library, and `crucible tasks
import` as a user runs it. Every hostile line is refused on its own, with one line naming the line and
the field, and a file with one bad line stores nothing. The API's upload: tests/api/test_payload_tasks.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.errors import ConfigError
from core.models import Task
from environments.chat.kind import ChatKind
from environments.read_number.kind import ReadNumberKind
from environments.read_number.task import instruction_for
from environments.service import register_environment
from environments.spec import parse_spec
from environments.tasks import import_tasks

ROOT = Path(__file__).parents[2]
CHAT = {"name": "support", "kind": "chat", "image": "base",
        "verifier": {"judge": {"url": "http://127.0.0.1:8000", "model": "policy", "rubric": "Polite and correct."}}}
NUMBER = {"name": "numbers", "kind": "read_number", "image": "code-repo"}
CHAT_LINES = [
    {"id": "refund-1", "instruction": "My order came broken.", "split": "train",
     "payload": {"follow_ups": ["It was a blue mug.", "Thanks!"]}},
    {"id": "greeting", "instruction": "Hello?", "payload": {}},
]
NUMBER_LINES = [
    {"id": "rn-42", "payload": {"path": "number.txt", "number": "42"}},
    {"id": "rn-7", "instruction": "Find the number and submit it.", "split": "test",
     "payload": {"path": "value.txt", "number": "7"}},
]
HOSTILE: list[tuple[str, Any, str]] = [
    # (environment, line, what the one-line error says)
    ("support", {"id": "c", "payload": {"follow_ups": []}}, ":1: instruction: expected a non-empty string, got None"),
    ("support", {"id": "c", "instruction": "hi", "payload": {"follow_ups": "thanks"}},
     ":1: payload.follow_ups: Input should be a valid list"),
    ("support", {"id": "c", "instruction": "hi", "payload": {"follow_ups": ["ok"] * 33}},
     ":1: payload.follow_ups: List should have at most 32 items"),
    ("support", {"id": "c", "instruction": "hi", "payload": {"follow_ups": ["x" * 16_001]}},
     ":1: payload.follow_ups.0: String should have at most 16000 characters"),
    ("support", {"id": "c", "instruction": "hi", "payload": {"follow_ups": [""]}},
     ":1: payload.follow_ups.0: String should have at least 1 character"),
    ("support", {"id": "c", "instruction": "hi", "payload": {"judge": {"url": "http://10.0.0.1"}}},
     ":1: payload.judge: Extra inputs are not permitted"),
    ("support", {"id": "c", "instruction": "hi", "payload": ["follow", "ups"]},
     ":1: payload: expected a chat task object like {\"follow_ups\": [\"And in French?\"]}"),
    ("support", {"id": "c", "instruction": "hi", "payload": {}, "hidden_tests": {"paths": ["t.py"]}},
     ":1: expected only id, instruction, split and payload, got ['hidden_tests']"),
    ("support", {"id": "", "instruction": "hi", "payload": {}}, ":1: id: expected a non-empty string, got ''"),
    ("support", {"id": "c" * 257, "instruction": "hi", "payload": {}}, ":1: id: expected at most 256 characters, got 257"),
    ("support", {"id": "c", "instruction": "hi", "split": "tr\u0000ain", "payload": {}},
     "split: expected a name of 1 to 64 printable characters"),
    ("support", ["not", "an", "object"], ":1: expected a JSON object, got list"),
    ("numbers", {"id": "r", "payload": {"path": "../../etc/passwd", "number": "1"}},
     ":1: payload.path: String should match pattern"),
    ("numbers", {"id": "r", "payload": {"path": "n.txt", "number": "12a"}}, ":1: payload.number: String should match pattern"),
    ("numbers", {"id": "r", "payload": {"path": "n.txt", "number": 42}}, ":1: payload.number: Input should be a valid string"),
    ("numbers", {"id": "r", "payload": {"path": "n.txt"}}, ":1: payload.number: Field required"),
    ("numbers", {"id": "r", "payload": {"path": "n.txt", "number": "1", "answer": "1"}},
     ":1: payload.answer: Extra inputs are not permitted"),
    ("numbers", {"id": "r", "instruction": 7, "payload": {"path": "n.txt", "number": "1"}},
     ":1: instruction: expected a non-empty string, got 7"),
]


@pytest.fixture
def environments(db_session: Session) -> None:
    register_environment(db_session, spec=parse_spec(CHAT))
    register_environment(db_session, spec=parse_spec(NUMBER))


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _rows(session: Session, environment: str) -> dict[str, Task]:
    session.expire_all()
    tasks = session.execute(select(Task).where(Task.environment_name == environment)).scalars()
    return {task.external_id: task for task in tasks}


def test_chat_and_read_number_tasks_import_and_parse_as_the_worker_parses_them(
        db_session: Session, environments: None, tmp_path: Path) -> None:
    assert import_tasks(db_session, environment="support", path=_write(tmp_path / "chat.jsonl", CHAT_LINES)) == 2
    assert import_tasks(db_session, environment="numbers", path=_write(tmp_path / "n.jsonl", NUMBER_LINES)) == 2
    chat = _rows(db_session, "support")
    assert chat["refund-1"].instruction == "My order came broken." and chat["refund-1"].split == "train"
    assert ChatKind.parse_task(chat["refund-1"].payload).follow_ups == ["It was a blue mug.", "Thanks!"]
    assert chat["greeting"].payload == {"follow_ups": []} and chat["greeting"].split == "train"
    numbers = _rows(db_session, "numbers")
    # An instruction left out is read_number's own sentence for the payload; a given one is kept.
    task = ReadNumberKind.parse_task(numbers["rn-42"].payload)
    assert numbers["rn-42"].instruction == instruction_for(task) and task.number == "42"
    assert numbers["rn-7"].instruction == "Find the number and submit it." and numbers["rn-7"].split == "test"
    # A re-import updates the same rows.
    changed = [{**NUMBER_LINES[0], "payload": {"path": "number.txt", "number": "43"}}]
    assert import_tasks(db_session, environment="numbers", path=_write(tmp_path / "n2.jsonl", changed)) == 1
    assert _rows(db_session, "numbers")["rn-42"].payload == {"path": "number.txt", "number": "43"}


@pytest.mark.parametrize(("environment", "line", "message"), HOSTILE, ids=[f"{e}-{i}" for i, (e, _, _) in enumerate(HOSTILE)])
def test_each_hostile_line_is_refused_and_nothing_is_stored(
        db_session: Session, environments: None, tmp_path: Path, environment: str, line: Any, message: str) -> None:
    good = CHAT_LINES[0] if environment == "support" else NUMBER_LINES[0]
    path = _write(tmp_path / "tasks.jsonl", [line, good])
    with pytest.raises(ConfigError) as raised:
        import_tasks(db_session, environment=environment, path=path)
    assert message in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    assert str(raised.value).startswith(f"{path}:1: ") or "split:" in message
    db_session.rollback()  # the CLI and the API roll back the transaction: the good line is not kept either
    assert _rows(db_session, environment) == {}


def _crucible(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def test_the_cli_imports_chat_and_read_number_jsonl_and_refuses_a_bad_file_in_one_line(
        db_session: Session, environments: None, tmp_path: Path) -> None:
    db_session.commit()  # the CLI is another process
    ok = _crucible("tasks", "import", "support", str(_write(tmp_path / "chat.jsonl", CHAT_LINES)), "-o", "json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"environment": "support", "imported": 2}
    ok = _crucible("tasks", "import", "numbers", str(_write(tmp_path / "n.jsonl", NUMBER_LINES)))
    assert ok.returncode == 0 and "imported 2 tasks into numbers" in ok.stdout, ok.stderr
    bad = _write(tmp_path / "bad.jsonl", [NUMBER_LINES[1], {"id": "r", "payload": {"path": "/etc/shadow", "number": "1"}}])
    for args, message in [
        (["numbers", str(bad)], f"{bad}:2: payload.path: String should match pattern"),
        (["support", str(bad)], f"{bad}:1: payload.path: Extra inputs are not permitted"),  # a read_number line
        (["numbers", "--format", "swebench", str(bad)], "format: expected crucible for 'numbers' (a read_number environment)"),
    ]:
        result = _crucible("tasks", "import", *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert message in lines[0], lines[0]
    assert sorted(_rows(db_session, "numbers")) == ["rn-42", "rn-7"]
    assert _rows(db_session, "numbers")["rn-7"].split == "test"  # the refused file changed nothing

