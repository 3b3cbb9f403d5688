"""Episodes through Celery (the SQLAlchemy transport on the test Postgres) with a real worker:
infrastructure faults are retried and never stored as the agent's outcome."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from core.models import Turn
from environments.parsing import hermes_call
from sandboxes import labels as L
from tests.factories import make_episode
from tests.support.calc import FIX
from tests.support.episode_fixtures import CELERY_WORKER as WORKER
from tests.support.episode_fixtures import wait_ended

# Sweeps, or runs a worker whose reaper sweeps, every crucible container on the machine: one xdist worker runs all of these.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]

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
    episode = wait_ended(db_session, episode_id)
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
    episode = wait_ended(db_session, episode_id)
    assert (episode.status, episode.termination_reason) == ("failed", "policy_error")
    assert len(episode.failures) == 2 and episode.reward is None
    # The worker asked this server, once per attempt at least (the client retries within one).
    assert policy.requests - asked >= 2
