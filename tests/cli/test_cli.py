"""`crucible run launch|ls|show|stop|resume` and `crucible controller --once`, through Typer's runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.controller import controller, runs_app
from core.models import Environment
from tests import factories as f

app = typer.Typer()
app.command()(controller)
app.add_typer(runs_app, name="run")  # as cli/main.py mounts them
runner = CliRunner()


def _invoke(*args: str) -> object:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def env(db_session: Session) -> Environment:
    env = f.queued_environment(db_session, name="bugs")
    f.tasks(db_session, env, 2)
    db_session.commit()
    return env


def test_launch_ls_show_stop_resume_as_json(env: Environment, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"name": "first", "model": "tiny", "environments": [{"name": "bugs"}],
                                      "mode": "sync", "batch_size": 2, "group_size": 4}))
    launched = _invoke("run", "launch", str(config), "-o", "json")
    assert (launched["name"], launched["status"], launched["mode"], launched["max_staleness"]) == (
        "first", "pending", "sync", 0)
    assert launched["environments"] == [{"name": "bugs", "version": 1, "kind": "code_repo", "weight": 1.0}]
    assert launched["config"]["max_inflight_groups"] == 2

    assert [run["name"] for run in _invoke("run", "ls", "-o", "json")] == ["first"]
    step = _invoke("controller", "--once", "-o", "json")  # sends to the real (SQLAlchemy) broker
    assert (step["leader"], step["dispatched"]) == (True, {str(launched["id"]): 2})
    shown = _invoke("run", "show", str(launched["id"]), "-o", "json")
    assert (shown["status"], shown["groups"], shown["episodes"]) == ("running", {"running": 2}, {"pending": 8})
    assert shown["dropped_by_reason"] == {} and shown["config"]["max_token_staleness"] == 0  # sync: 2 × 0
    assert _invoke("run", "stop", str(launched["id"]), "-o", "json")["status"] == "stopped"
    assert [r["id"] for r in _invoke("run", "ls", "--status", "stopped", "-o", "json")] == [launched["id"]]
    assert _invoke("run", "resume", str(launched["id"]), "-o", "json")["status"] == "running"
    table = runner.invoke(app, ["run", "ls"])
    assert table.exit_code == 0 and "first" in table.stdout and "bugs v1" in table.stdout, table.output


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"name": "x", "model": "tiny", "environments": [{"name": "bugs"}], "group_size": 0},
         "group_size: Input should be greater than or equal to 1 (got 0)"),
        ({"name": "x", "model": "tiny", "environments": [{"name": "nope"}]}, "no environment named 'nope'"),
        ({"name": "x", "model": "tiny", "environments": [{"name": "bugs"}], "colour": "red"},
         "colour: Extra inputs are not permitted"),
    ],
)
def test_a_bad_config_is_one_readable_line(env: Environment, tmp_path: Path, config: dict, message: str) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    result = runner.invoke(app, ["run", "launch", str(path)])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_show_an_unknown_run(env: Environment) -> None:
    result = runner.invoke(app, ["run", "show", "999", "-o", "json"])
    assert result.exit_code == 2
    assert "no run with id 999" in result.stderr
