"""`crucible env serve` refuses at the edge, in one line naming what it expected, before any sandbox is
made: no protocol named, a host other than loopback, an unknown environment, a split without tasks, an
environment whose reward needs a judge, and a task whose payload is not of the environment's kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.main import app
from environments.service import register_environment
from environments.spec import load_spec_file, parse_spec
from tests import factories

ROOT = Path(__file__).parents[2]


def _serve(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["env", "serve", *args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(("args", "expected"), [
    (("calc",), "error: expected --openenv (the one protocol `crucible env serve` speaks), got none"),
    (("calc", "--openenv", "--host", "0.0.0.0"), "error: --host: expected a loopback address (127.0.0.1, ::1), got '0.0.0.0'"),
    (("calc", "--openenv", "--host", "example.com"), "error: --host: expected a loopback address (127.0.0.1, ::1), got 'example.com'"),
    (("calc", "--openenv", "--port", "0"), "Invalid value for '--port'"),
])
def test_bad_options_are_refused_before_anything_starts(args: tuple[str, ...], expected: str) -> None:
    code, out = _serve(*args)
    assert code == 2 and expected in out, out


def test_environments_it_cannot_serve_are_refused(db_session: Session) -> None:
    assert _serve("no-such-env", "--openenv")[1].startswith("error: no environment")
    register_environment(db_session, spec=load_spec_file(ROOT / "examples" / "chat.yaml"))
    spec = {"name": "serve-numbers", "kind": "read_number", "image": "code-repo"}
    env, _ = register_environment(db_session, spec=parse_spec(spec))
    factories.task(db_session, env, split="train", external_id="odd", payload={"path": "n.txt", "number": "12"})
    factories.task(db_session, env, split="test", external_id="broken", payload={"repo": "not a number task"})
    db_session.commit()
    code, out = _serve("support-chat", "--openenv")
    assert code == 2 and "its verifier asks a judge or a reward model" in out, out
    code, out = _serve("serve-numbers", "--openenv", "--split", "nope")
    assert code == 2 and "--split: environment 'serve-numbers' has no task in split 'nope'" in out, out
    code, out = _serve("serve-numbers", "--openenv", "--split", "test")
    assert code == 2 and "task 'broken' of 'serve-numbers': its payload is not a read_number task" in out, out
