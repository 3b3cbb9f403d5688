"""The controller's messages reach a real Celery worker: the app from `create_app(load_settings())`
(Celery's SQLAlchemy transport on the test Postgres) and a test task registered as
`crucible.run_episode` on the environment kind's queue."""

from __future__ import annotations

import threading
import uuid

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from controller.dispatcher import EPISODE_TASK
from controller.loop import Controller
from core.settings import load_settings
from task_workers.celery_app import create_app
from tests import factories as f
from tests.support.celery_worker import embedded_worker


def test_dispatched_episodes_are_delivered_to_a_worker(db_session: Session, engine: Engine) -> None:
    queue = f"controller-test-{uuid.uuid4().hex[:8]}"  # a queue of its own: no other test's messages
    env = f.queued_environment(db_session, kind=queue)
    f.tasks(db_session, env, 1)
    run = f.launch(db_session, env, mode="sync", batch_size=1, group_size=3)

    app = create_app(load_settings())
    app.conf.imports = []
    app.tasks.pop(EPISODE_TASK, None)  # the real task, if another test imported it; ours records instead
    seen: list[int] = []
    delivered = threading.Event()

    @app.task(name=EPISODE_TASK, shared=False)  # not shared: later apps must get the real task
    def run_episode(episode_id: int) -> None:
        seen.append(episode_id)
        if len(seen) == run.group_size:
            delivered.set()

    controller = Controller(engine=engine, dispatcher=app, name="broker-test")
    try:
        assert controller.step().dispatched == {run.id: 1}
    finally:
        controller.close()
    with embedded_worker(app, queues=[queue]):
        assert delivered.wait(60), f"the worker got {seen}"
    assert sorted(seen) == [e.id for e in f.episodes(db_session, run.id)]
