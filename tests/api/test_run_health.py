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
