"""`crucible sandbox …` and `crucible images …` through Typer's CliRunner, table and JSON output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.images import app as images_app
from cli.sandbox import app

from .conftest import CLI_ENV_LABEL

# Sweeps, or runs a worker whose reaper sweeps, every crucible container on the machine: one xdist worker runs all of these.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]
runner = CliRunner()


def invoke(*args: str, code: int = 0, cli=app) -> str:
    result = runner.invoke(cli, list(args), env={"COLUMNS": "250"})
    assert result.exit_code == code, (args, result.output)
    return result.stdout


def test_sandbox_verbs_end_to_end(sandbox_images: dict[str, str], tmp_path: Path) -> None:
    created = json.loads(invoke(
        "create", "--image", sandbox_images["code-repo"], "--seed", "/opt/seed", "--memory", "512m",
        "--ttl", "10m", "--env-name", CLI_ENV_LABEL, "-e", "GREETING=hi", "-o", "json",
    ))
    sid, cid = created["sandbox_id"], created["container_id"]
    try:
        listed = json.loads(invoke("ls", "--env", CLI_ENV_LABEL, "-o", "json"))
        assert [row["sandbox_id"] for row in listed] == [sid]
        assert CLI_ENV_LABEL in invoke("ls", "--env", CLI_ENV_LABEL)
        assert json.loads(invoke("ls", "--env", CLI_ENV_LABEL, "--older-than", "1d", "-o", "json")) == []

        assert invoke("exec", sid, "--", 'echo "$GREETING"; (exit 3)', code=3) == "hi\n"
        ran = json.loads(invoke("exec", "-o", "json", cid[:8], "--", "ls", "calc.py"))
        assert ran["stdout"] == "calc.py\n" and ran["exit_code"] == 0 and ran["status"] == "ok"
        invoke("exec", sid, "--", "echo change >> calc.py; echo new > new.txt")

        diff = json.loads(invoke("diff", sid, "-o", "json"))["diff"]
        assert "+change" in diff and "new.txt" in diff
        history = json.loads(invoke("history", sid, "-o", "json"))
        assert [e["exit_code"] for e in history if "GREETING" in e["command"]] == [3]
        assert "GREETING" in invoke("history", sid)

        info = json.loads(invoke("info", sid, "-o", "json"))
        assert info["spec"]["workspace_seed"] == "/opt/seed" and info["labels"]["crucible.env"] == CLI_ENV_LABEL
        stats = json.loads(invoke("stats", sid, "-o", "json"))
        assert stats["pids"] >= 1 and "/workspace" in stats["tmpfs"]
        assert json.loads(invoke("logs", sid, "-o", "json")) == {"logs": ""}

        invoke("cp", f"{sid}:/workspace/calc.py", str(tmp_path / "calc.py"))
        assert "change" in (tmp_path / "calc.py").read_text()
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "x.txt").write_text("uploaded\n")
        invoke("cp", str(tmp_path / "up"), f"{sid}:/workspace/")
        assert invoke("exec", sid, "--", "cat up/x.txt") == "uploaded\n"
        invoke("exec", sid, "--", "false", code=1)

        shell = json.loads(invoke("shell", sid, "-o", "json", code=0))
        assert shell["argv"][:3] == ["docker", "exec", "-it"]
        assert json.loads(invoke("rm", "--all", "--env", CLI_ENV_LABEL, "--dry-run", "-o", "json")) == {
            "removed": [sid], "dry_run": True,
        }
        assert isinstance(json.loads(invoke("prune", "--dry-run", "-o", "json")), list)
    finally:
        removed = json.loads(invoke("rm", sid, "-o", "json"))
    assert removed == {"removed": [sid], "dry_run": False}
    assert json.loads(invoke("ls", "--env", CLI_ENV_LABEL, "-o", "json")) == []


def test_unknown_sandbox_is_one_readable_error() -> None:
    result = runner.invoke(app, ["info", "sb-doesnotexist"])
    assert result.exit_code == 2
    assert "expected a sandbox id or container-id prefix" in result.output


def test_images_verbs(sandbox_images: dict[str, str]) -> None:
    rows = json.loads(invoke("ls", "-o", "json", cli=images_app))
    assert {r["name"]: r["tag"] for r in rows} == sandbox_images and all(r["built"] for r in rows)
