"""A train run with nobody training it says so: `waiting_for_trainer` in `GET /v1/runs/{id}`.

The trainer is detected by what every real trainer does: it holds the run's Postgres advisory lock
(trainer.store.hold_trainer_lock), which a killed trainer's dropped connection releases.
"""

from __future__ import annotations

import pytest
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.api_client import use_http_client
from cli.follow import follow
from core.settings import get_settings
from tests import factories
from trainer.store import hold_trainer_lock


def _train_run_with_complete_groups(db_session: Session, *, complete: int, status: str = "running") -> int:
    env = factories.environment(db_session)
    task = factories.task(db_session, env)
    run = factories.run(db_session, status=status, purpose="train", batch_size=2)
    for _ in range(complete):
        factories.group(db_session, run=run, env=env, task=task, status="complete")
    factories.group(db_session, run=run, env=env, task=task, status="running")
    db_session.commit()
    return run.id


def test_a_train_run_without_a_trainer_says_it_waits_for_one(client: TestClient, db_session: Session) -> None:
    run_id = _train_run_with_complete_groups(db_session, complete=3)
    note = client.get(f"/v1/runs/{run_id}").json()["waiting_for_trainer"]
    assert note.startswith("waiting for a trainer: 3 complete groups wait (a step takes 2)")
    assert f"crucible trainer --run {run_id}" in note


def test_an_attached_trainer_clears_the_note_and_a_gone_one_brings_it_back(
    client: TestClient, db_session: Session, engine: Engine
) -> None:
    run_id = _train_run_with_complete_groups(db_session, complete=1)
    lock = hold_trainer_lock(engine, run_id=run_id)
    try:
        assert client.get(f"/v1/runs/{run_id}").json()["waiting_for_trainer"] is None
    finally:
        lock.release()  # as a trainer that exits (a killed one's dropped connection releases it too)
    assert "1 complete group waits" in client.get(f"/v1/runs/{run_id}").json()["waiting_for_trainer"]


def test_no_note_when_nothing_waits_or_the_run_is_not_a_running_train_run(
    client: TestClient, db_session: Session
) -> None:
    nothing_complete = _train_run_with_complete_groups(db_session, complete=0)
    stopped = _train_run_with_complete_groups(db_session, complete=2, status="stopped")
    env = factories.environment(db_session)
    task = factories.task(db_session, env)
    evaluation = factories.run(db_session, status="running", purpose="eval")
    factories.group(db_session, run=evaluation, env=env, task=task, status="complete")
    db_session.commit()
    for run_id in (nothing_complete, stopped, evaluation.id):
        assert client.get(f"/v1/runs/{run_id}").json()["waiting_for_trainer"] is None, run_id


def test_run_follow_shows_the_note(
    app: FastAPI, token: str, db_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _train_run_with_complete_groups(db_session, complete=2)
    monkeypatch.setenv("CRUCIBLE_API_TOKEN", token)
    monkeypatch.setenv("CRUCIBLE_API_URL", "http://crucible.test:8080")
    get_settings.cache_clear()
    cli = typer.Typer()
    cli.command("follow")(follow)
    cli.command("unused")(lambda: None)  # two commands: typer keeps the command name as a subcommand
    try:
        with TestClient(app) as http, use_http_client(http):
            result = CliRunner().invoke(cli, ["follow", str(run_id), "--once"], env={"COLUMNS": "250"})
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "waiting for a trainer: 2 complete groups wait" in result.output


def test_a_run_whose_tool_calls_mostly_fail_to_parse_says_so(client: TestClient, db_session: Session) -> None:
    """More than 20 % of the turns of the run's latest ended episodes without a readable tool call: the run
    view and the run page say so (a parser of another chat-template family than the model's, most often)."""
    env = factories.environment(db_session)
    task = factories.task(db_session, env)
    run = factories.run(db_session, status="running", purpose="train")
    group = factories.group(db_session, run=run, env=env, task=task, status="complete")
    for sample, (unparsed, missing) in enumerate([(0, 0), (1, 0), (0, 1)]):
        factories.episode(db_session, group, sample_index=sample, termination_reason="max_turns", status="completed",
                          num_turns=4, unparsed_tool_calls=unparsed, turns_without_tool_call=missing)
    db_session.commit()
    assert client.get(f"/v1/runs/{run.id}").json()["tool_call_failures"] is None  # 2 of 12 turns: 17 %
    factories.episode(db_session, group, sample_index=3, termination_reason="format_error", status="completed",
                      num_turns=3, unparsed_tool_calls=1, turns_without_tool_call=2)
    db_session.commit()
    note = client.get(f"/v1/runs/{run.id}").json()["tool_call_failures"]
    assert note.startswith("tool calls fail: in the last 4 ended episodes, 2 of 15 turns held a tool call that did "
                           "not parse and 3 held none (33% > 20%)")
    assert 'id="tool-call-failures"' in client.get(f"/runs/{run.id}").text
