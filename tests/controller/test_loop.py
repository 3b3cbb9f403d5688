"""The controller pass: runs are independent, and a run that cannot draw a task says why."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from controller.config import ControllerConfig
from controller.dispatcher import RecordingDispatcher
from controller.loop import Controller
from core.models import Task
from tests import factories as f


def test_a_run_without_eligible_tasks_is_reported_and_the_others_go_on(
    db_session: Session, engine: Engine, recorder: RecordingDispatcher, settings: ControllerConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stuck_env, good_env = f.queued_environment(db_session, name="stuck"), f.queued_environment(db_session, name="good")
    f.tasks(db_session, stuck_env, 2)
    f.tasks(db_session, good_env, 2)
    stuck, good = f.launch(db_session, stuck_env), f.launch(db_session, good_env)
    db_session.execute(update(Task).where(Task.environment_name == "stuck").values(pass_rate=0.0, difficulty="hard"))
    db_session.commit()  # measured after launch: every task is now below the band

    controller = Controller(engine=engine, dispatcher=recorder, settings=settings, name="test")
    try:
        with caplog.at_level(logging.ERROR, logger="crucible.controller"):
            first = controller.step()
            second = controller.step()
    finally:
        controller.close()
    assert first.dispatched == {good.id: 4}  # (1 + 1) × 2 groups
    assert "environment 'stuck' has no eligible task in split 'train'" in first.errors[stuck.id]
    assert second.errors == first.errors
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("controller.run_error")]
    assert len(logged) == 1 and f"run_id={stuck.id}" in logged[0]  # once, not on every pass
