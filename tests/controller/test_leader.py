"""Leader election: of two controllers only the lock holder dispatches; when its connection closes
(the process died) the other takes over from the state in the database."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from controller.dispatcher import RecordingDispatcher
from controller.loop import Controller
from core.db import make_engine
from core.models import EpisodeGroup
from tests import factories as f
from tests.support.polling import wait_for


@pytest.fixture
def engines(database_url: str) -> Iterator[Callable[[], Engine]]:
    """Separate engines, as separate controller processes would have."""
    made: list[Engine] = []

    def make() -> Engine:
        made.append(make_engine(database_url))
        return made[-1]

    yield make
    for engine in made:
        engine.dispose()


def _terminate(engine: Engine, pid: int) -> None:
    """Kill a backend as a crashed host would drop it."""
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()


def _group_count(session: Session, run_id: int) -> int:
    session.rollback()  # a fresh snapshot
    return session.execute(select(func.count()).where(EpisodeGroup.run_id == run_id)).scalar_one()


def test_only_the_leader_dispatches_and_the_other_takes_over(
    db_session: Session, engine: Engine, engines: Callable[[], Engine]
) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 2)
    run = f.launch(db_session, env, mode="sync", batch_size=2, group_size=2)
    first, second = RecordingDispatcher(), RecordingDispatcher()
    one = Controller(engine=engines(), dispatcher=first, name="one")
    two = Controller(engine=engines(), dispatcher=second, name="two")
    try:
        assert one.step().leader
        assert not two.step().leader
        assert (len(first.sent), second.sent) == (4, [])

        pid = one.lock.backend_pid
        assert pid is not None
        _terminate(engine, pid)  # "one" is gone: its session and advisory lock with it
        f.finish_groups(db_session, [g.id for g in f.groups(db_session, run.id)])
        f.train_step(db_session, run.id)
        assert two.step().dispatched == {run.id: 2}
        assert not one.step().leader  # back, but the lock is taken
        assert (len(first.sent), len(second.sent)) == (4, 4)
        assert set(first.episode_ids).isdisjoint(second.episode_ids)
    finally:
        one.close()
        two.close()


def test_two_controller_loops_in_threads(db_session: Session, engines: Callable[[], Engine]) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 2)
    run = f.launch(db_session, env, mode="sync", batch_size=2, group_size=2)
    recorders = {"a": RecordingDispatcher(), "b": RecordingDispatcher()}
    loops = {name: Controller(engine=engines(), dispatcher=recorders[name], name=name) for name in recorders}
    stops = {name: threading.Event() for name in loops}
    threads = {name: threading.Thread(target=loops[name].run_forever, args=(0.02,), kwargs={"stop": stops[name]})
               for name in loops}
    for thread in threads.values():
        thread.start()
    try:
        wait_for(lambda: sum(len(r.sent) for r in recorders.values()) == 4, timeout=30, what="the first batch")
        assert _group_count(db_session, run.id) == 2
        leader = next(name for name, recorder in recorders.items() if recorder.sent)
        follower = "b" if leader == "a" else "a"
        assert len(recorders[leader].sent) == 4 and recorders[follower].sent == []

        stops[leader].set()
        threads[leader].join(timeout=30)  # run_forever closes the lock's connection on the way out
        assert not threads[leader].is_alive()
        f.finish_groups(db_session, [g.id for g in f.groups(db_session, run.id)])
        f.train_step(db_session, run.id)
        wait_for(lambda: len(recorders[follower].sent) == 4, timeout=30, what="the follower to take over")
        assert _group_count(db_session, run.id) == 4 and len(recorders[leader].sent) == 4
    finally:
        for name, thread in threads.items():
            stops[name].set()
            thread.join(timeout=30)
