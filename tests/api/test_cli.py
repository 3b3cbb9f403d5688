"""`crucible episodes ls|show`, `crucible open`, `crucible run follow` over the API (the app in-process
through `use_http_client`), with `-o json` and one-line errors."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from cli import episodes
from cli import open as open_
from cli.api_client import ApiClient, ApiClientError
from cli.follow import follow, sparkline
from tests.api.trajectories import SeededRun

runner = CliRunner()


def _app_of(name: str, command) -> typer.Typer:  # type: ignore[no-untyped-def]
    """A root like cli/main.py's, holding one command under its name."""
    app = typer.Typer()
    app.command(name)(command)
    app.command("unused")(lambda: None)  # two commands: typer keeps the command name as a subcommand
    return app


def test_episodes_ls_filters_on_the_server(cli_env: None, seeded: SeededRun) -> None:
    result = runner.invoke(episodes.app, ["ls", "--run", str(seeded.run_id), "-q", "segfault", "-o", "json"])
    assert result.exit_code == 0, result.output
    page = json.loads(result.output)
    assert [row["termination_reason"] for row in page["data"]] == ["format_error"]
    table = runner.invoke(episodes.app, ["ls", "--reason", "submitted", "--limit", "2"])
    assert table.exit_code == 0 and "more: --cursor" in table.output


def test_episodes_show_prints_turns_and_json(cli_env: None, seeded: SeededRun) -> None:
    episode_id = seeded.episode_ids[0][1]
    text = runner.invoke(episodes.app, ["show", str(episode_id)])
    assert text.exit_code == 0, text.output
    assert "max_turns" in text.output and "exit 1" in text.output and "truncated 512 bytes" in text.output
    data = json.loads(runner.invoke(episodes.app, ["show", str(episode_id), "--tokens", "-o", "json"]).output)
    assert data["turns"][0]["tokens"]["pieces"] == ["fix", "the", "bug", "run", "pytest"]


def test_errors_are_one_readable_line(cli_env: None, seeded: SeededRun) -> None:
    result = runner.invoke(episodes.app, ["show", "999"])
    assert result.exit_code == 2
    assert "error: GET /v1/episodes/999: 404 not_found: no episode with id 999" in result.output
    assert "Traceback" not in result.output


def test_an_unreachable_api_and_a_missing_token_say_what_to_do() -> None:
    down = ApiClient(base_url="http://127.0.0.1:9", token="cru_x", timeout_s=2)
    with pytest.raises(ApiClientError, match=r"cannot reach the API at http://127.0.0.1:9 .*start it with `crucible api`"):
        down.get("/v1/runs")
    with pytest.raises(ApiClientError, match="no API token: set CRUCIBLE_API_TOKEN"):
        ApiClient(base_url="http://127.0.0.1:9", token=None).get("/v1/runs")


def test_open_prints_dashboard_links(cli_env: None, seeded: SeededRun) -> None:
    app = _app_of("open", open_.open_)
    for ref, path in ((str(seeded.run_id), f"/runs/{seeded.run_id}"), (f"group/{seeded.group_ids[0]}", f"/groups/{seeded.group_ids[0]}"),
                      (f"e{seeded.episode_ids[0][0]}", f"/episodes/{seeded.episode_ids[0][0]}")):
        result = runner.invoke(app, ["open", ref])
        assert result.exit_code == 0, result.output
        assert result.output.strip() == f"http://crucible.test:8080{path}"
    missing = runner.invoke(app, ["open", "run/999"])
    assert missing.exit_code == 2 and "404 not_found: no run with id 999" in missing.output
    bad = runner.invoke(app, ["open", "task/3", "--no-check"])
    assert bad.exit_code == 2 and "expected a run, group or episode like 3, run/3" in bad.output


def test_open_parses_references() -> None:
    assert open_.parse_ref("12") == ("run", 12)
    assert open_.parse_ref("Episode/7") == ("episode", 7)
    assert open_.parse_ref("ep:7") == ("episode", 7)
    assert open_.parse_ref("g40") == ("group", 40)


def test_follow_once_as_json_and_as_a_live_view(cli_env: None, seeded: SeededRun) -> None:
    app = _app_of("follow", follow)
    result = runner.invoke(app, ["follow", str(seeded.run_id), "--once", "-o", "json"])
    assert result.exit_code == 0, result.output
    snap = json.loads(result.output.splitlines()[0])
    assert snap["axis"] == "step" and snap["reward"] == [0.375] and snap["run"]["status"] == "running"
    live = runner.invoke(app, ["follow", str(seeded.run_id), "--once"])
    assert live.exit_code == 0, live.output
    assert "episodes ended" in live.output and "10/12" in live.output and "policy version 2" in live.output


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([None, 1.0]) == " ▁"
    assert sparkline([]) == ""


HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\x1b[31mred\u009b31m\u202eevil[bold]markup[/bold]\rover"


def test_episodes_show_escapes_terminal_control_sequences(cli_env: None, seeded: SeededRun) -> None:
    """Model and tool output is stored text from an adversary: it must not reach the terminal raw."""
    from sqlalchemy import update

    from core.db import session_scope
    from core.models import Episode, Turn

    episode_id = seeded.episode_ids[0][1]
    with session_scope() as session:
        session.execute(update(Turn).where(Turn.episode_id == episode_id).values(
            completion_text=HOSTILE, observation=HOSTILE, tool_call=["not", "a", "mapping"]))
        session.execute(update(Episode).where(Episode.id == episode_id).values(verifier_layers=[{"name": HOSTILE}]))
    result = runner.invoke(episodes.app, ["show", str(episode_id)])
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\x07", "\u009b", "\u202e", "\r"):
        assert raw not in result.output
    assert "ok\\x1b]0;pwned\\x07\\x1b[2J" in result.output and "\\x9b31m\\u202eevil[bold]markup[/bold]" in result.output
    as_json = runner.invoke(episodes.app, ["show", str(episode_id), "-o", "json"])
    assert "\x1b" not in as_json.output and "\u009b" not in as_json.output
    assert json.loads(as_json.output)["turns"][0]["completion_text"] == HOSTILE
