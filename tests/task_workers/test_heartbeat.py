"""Worker incarnations (issue 24): each worker process beats under its name with its own incarnation; a
process that starts under a name whose previous incarnation did not stop takes the row over, and the
superseded one can no longer beat under it."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Worker
from task_workers import heartbeat


def _as(monkeypatch: pytest.MonkeyPatch, incarnation: str) -> None:
    """Act as the worker process with this incarnation (two processes, played by one)."""
    monkeypatch.setattr(heartbeat, "incarnation", lambda: incarnation)


def _row(session: Session, name: str) -> Worker:
    session.expire_all()
    return session.execute(select(Worker).where(Worker.name == name)).scalar_one()


def test_a_restart_after_a_kill_takes_the_name_over_and_the_old_process_cannot_beat_back(
    db_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(monkeypatch, "first")
    assert heartbeat.take_over(name="w", queues=["code_repo"]) is None  # a new name: nobody before it
    assert heartbeat.beat(name="w", queues=["code_repo"]) is True
    # SIGKILL: no mark_stopped. The restarted process (same name, as compose restarts it):
    _as(monkeypatch, "second")
    assert heartbeat.take_over(name="w", queues=["code_repo"]) == "first"
    assert _row(db_session, "w").incarnation == "second"
    # The first process, were it still running (two processes given one name), beats in vain.
    _as(monkeypatch, "first")
    assert heartbeat.beat(name="w", queues=["code_repo"]) is False
    heartbeat.mark_stopped(name="w")  # and its clean stop does not stop its successor
    row = _row(db_session, "w")
    assert (row.incarnation, row.stopped_at) == ("second", None)


def test_after_a_clean_stop_nothing_is_lost(db_session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    _as(monkeypatch, "first")
    heartbeat.take_over(name="w", queues=["q"])
    heartbeat.mark_stopped(name="w")
    assert _row(db_session, "w").stopped_at is not None
    _as(monkeypatch, "second")
    assert heartbeat.take_over(name="w", queues=["q"]) is None
    assert _row(db_session, "w").stopped_at is None


def test_each_process_has_its_own_incarnation_and_only_an_announced_one_is_recorded(
    db_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing

    mine = heartbeat.incarnation()
    assert mine == heartbeat.incarnation() and len(mine) == 32
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(heartbeat.incarnation) != mine
    monkeypatch.setattr(heartbeat, "_announced", set())
    assert heartbeat.announced() is None  # never took a name over: its episodes carry no incarnation
    heartbeat.take_over(name="w", queues=["q"])
    assert heartbeat.announced() == mine
