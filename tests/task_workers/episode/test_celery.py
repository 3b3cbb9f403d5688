"""Episodes through Celery (the SQLAlchemy transport on the test Postgres) with a real worker:
infrastructure faults are retried and never stored as the agent's outcome."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode, Turn
from core.settings import get_settings
from environments.parsing import hermes_call
from sandboxes import labels as L
from task_workers.celery_app import create_app
from task_workers.context import close_worker_context
from tests.support.celery_worker import embedded_worker
from tests.task_workers.episode.conftest import FIX, make_episode

# Sweeps, or runs a worker whose reaper sweeps, every crucible container on the machine: one xdist worker runs all of these.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]

WORKER = f"celery-test-worker-{os.getpid()}"  # per process: another xdist worker runs its own


@pytest.fixture
def celery_worker(scripted, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A real Celery worker thread consuming code_repo, pointed at the scripted policy server."""
    monkeypatch.setenv("CRUCIBLE_POLICY_URL", scripted[1])
    monkeypatch.setenv("CRUCIBLE_WORKER_NAME", WORKER)
    monkeypatch.setenv("CRUCIBLE_SANDBOX_POOL_MIN", "0")
    get_settings.cache_clear()
    app = create_app()
    app.conf.task_default_queue = "code_repo"
    try:
        with embedded_worker(app, queues=["code_repo"]):
            yield app
    finally:
        close_worker_context()
        get_settings.cache_clear()


def _wait_ended(session: Session, episode_id: int, timeout: float = 240) -> Episode:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        session.expire_all()
        episode = session.get(Episode, episode_id)
        if episode is not None and episode.status in ("completed", "failed"):
            return episode
        time.sleep(0.3)
    raise AssertionError(f"episode {episode_id} did not end in {timeout}s")


def test_a_sandbox_killed_mid_episode_is_retried_and_stored_once(
    db_session, scripted, celery_worker, backend, code_repo_image, calc_task_payload
) -> None:
    policy, _ = scripted
    killed = threading.Event()

    def kill_my_sandbox(_: str) -> str:
        if not killed.is_set():
            killed.set()
            for info in backend.list(labels={L.WORKER: WORKER}):
                backend.remove(info.id)
        return hermes_call("bash", command="ls")

    policy.scripts["doomed"] = [FIX[0], kill_my_sandbox, *FIX[1:]]
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="doomed")
    celery_worker.send_task("crucible.run_episode", args=[episode_id], queue="code_repo")
    episode = _wait_ended(db_session, episode_id)
    assert killed.is_set()
    assert episode.status == "completed" and episode.termination_reason == "submitted"
    assert episode.attempts == 2
    assert [f["reason"] for f in episode.failures] == ["sandbox_error"]
    turns = db_session.execute(select(Turn.index).where(Turn.episode_id == episode_id)).scalars().all()
    assert sorted(turns) == list(range(len(turns)))  # one copy: the retry's turns only


def test_a_policy_server_that_keeps_failing_ends_as_policy_error(
    db_session, scripted, celery_worker, code_repo_image, calc_task_payload, monkeypatch: pytest.MonkeyPatch
) -> None:
    from task_workers.policy.scripted import Reply

    policy, _ = scripted
    policy.scripts["down"] = [Reply("", status=503)]
    monkeypatch.setattr("task_workers.tasks.MAX_RETRIES", 1)
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="down")
    asked = policy.requests
    celery_worker.send_task("crucible.run_episode", args=[episode_id], queue="code_repo")
    episode = _wait_ended(db_session, episode_id)
    assert (episode.status, episode.termination_reason) == ("failed", "policy_error")
    assert len(episode.failures) == 2 and episode.reward is None
    # The worker asked this server, once per attempt at least (the client retries within one).
    assert policy.requests - asked >= 2
