"""The whole line with real processes: a `crucible worker` is SIGKILLed mid-episode; the controller
sees its heartbeat go stale, marks the episode `worker_lost` and redispatches it; a second worker
runs it; exactly one copy is stored; the dead worker's sandbox is reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from api.services.tokens import create_token
from controller.config import ControllerConfig
from controller.loop import Controller
from controller.runs import create_run
from core.models import Episode, Run, Task, Turn, Worker
from core.schemas import RunConfig
from core.settings import load_settings
from environments.service import register_environment
from environments.spec import parse_spec
from sandboxes import labels as L
from task_workers.celery_app import create_app
from task_workers.policy.scripted import Reply
from tests.support.calc import FIX, env_spec
from tests.support.polling import wait_for
from tests.support.processes import stop_group

# Sweeps, or runs a worker whose reaper sweeps, every crucible container on the machine: one xdist worker runs all of these.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def start_worker(database_url: str, scripted, tmp_path: Path) -> Iterator:
    started: list[subprocess.Popen] = []

    def start(name: str) -> subprocess.Popen:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")},
               "CRUCIBLE_DATABASE_URL": database_url, "CRUCIBLE_POLICY_URL": scripted[1],
               "CRUCIBLE_WORKER_NAME": name, "CRUCIBLE_SANDBOX_POOL_MIN": "0",
               "CRUCIBLE_DATA_DIR": str(tmp_path), "CRUCIBLE_WORKER_CONCURRENCY": "1"}
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen([sys.executable, "-m", "cli.main", "worker", "-Q", "code_repo"], cwd=ROOT, env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(process)
        return process

    yield start
    for process in started:
        stop_group(process)


def _heartbeat(session: Session, name: str) -> bool:
    session.expire_all()
    return session.execute(select(Worker).where(Worker.name == name)).scalar_one_or_none() is not None


def test_a_worker_killed_mid_episode_is_redispatched_and_stored_once(
    db_session: Session, scripted, start_worker, engine, backend, code_repo_image, calc_task_payload
) -> None:
    policy, _ = scripted
    in_flight, release = threading.Event(), threading.Event()

    def stall_first_time(_: str) -> Reply:
        if not in_flight.is_set():
            in_flight.set()
            release.wait(120)  # worker 1 waits here on the policy, mid-episode, until it is killed
        return Reply(FIX[0])

    policy.scripts["killed"] = [stall_first_time, *FIX[1:]]
    register_environment(db_session, spec=parse_spec(env_spec(code_repo_image)))
    db_session.add(Task(environment_name="calc", external_id="calc-killed", instruction="Fix add(). [script:killed]",
                        payload=calc_task_payload))
    db_session.commit()
    run = create_run(db_session, config=RunConfig(name="killed", model="scripted", purpose="eval", group_size=1,
                                                  batch_size=1, max_groups=1, environments=[{"name": "calc"}]))
    db_session.commit()
    controller = Controller(engine=engine, dispatcher=create_app(load_settings()),
                            settings=ControllerConfig(heartbeat_timeout_s=600, deadline_slack_s=0))
    first = start_worker("worker-1")
    wait_for(lambda: _heartbeat(db_session, "worker-1"), timeout=120, what="worker 1 to beat")
    assert controller.step().dispatched == {run.id: 1}
    wait_for(in_flight.is_set, timeout=120, what="worker 1 to be mid-episode")
    episode_id = db_session.execute(select(Episode.id).where(Episode.run_id == run.id)).scalar_one()
    victim_containers = [info.id for info in backend.list(labels={L.WORKER: "worker-1"})]
    assert victim_containers, "worker 1 holds a sandbox"
    # (issue 50) The real worker serves its sandbox control service at the URL it published: its episode's
    # sandbox, leased to the run, is listed for a live API token, and nothing for none.
    control_url = db_session.execute(select(Worker.control_url).where(Worker.name == "worker-1")).scalar_one()
    _, token = create_token(db_session, name="control")
    db_session.commit()
    assert httpx.get(f"{control_url}/v1/sandboxes", timeout=30).status_code == 401
    listed = httpx.get(f"{control_url}/v1/sandboxes", headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
    assert [row["run"] for row in listed] == [str(run.id)]

    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    release.set()
    # The episode is overdue; worker 1's last beat is recent, so it is not lost yet.
    db_session.execute(update(Episode).where(Episode.id == episode_id).values(deadline_at=Episode.created_at))
    db_session.commit()
    start_worker("worker-2")
    wait_for(lambda: _heartbeat(db_session, "worker-2"), timeout=120, what="worker 2 to beat")
    assert controller.step().resent == 0
    # Worker 1's heartbeat goes stale (its row aged, not a clock waited on): now the episode is lost.
    db_session.execute(update(Worker).where(Worker.name == "worker-1")
                       .values(last_heartbeat_at=func.now() - timedelta(hours=1)))
    db_session.commit()
    report = controller.step()
    assert report.resent == 1, report

    def ended() -> bool:
        db_session.expire_all()
        return db_session.get(Episode, episode_id).status in ("completed", "failed")

    wait_for(ended, timeout=240, what="the redispatched episode to end")
    controller.close()
    episode = db_session.get(Episode, episode_id)
    assert (episode.status, episode.termination_reason, episode.worker) == ("completed", "submitted", "worker-2")
    assert [f["reason"] for f in episode.failures] == ["worker_lost"]
    assert episode.reward_components["hidden_tests"] == 1.0
    turns = db_session.execute(select(Turn.index).where(Turn.episode_id == episode_id)).scalars().all()
    assert sorted(turns) == [0, 1, 2, 3]  # one copy
    # Worker 2's reaper swept worker 1's orphaned sandbox (its owner process is dead).
    wait_for(lambda: not any(backend.get(cid) for cid in victim_containers), timeout=90, what="the orphan to be reaped")


def test_a_worker_killed_and_restarted_under_its_name_has_its_episode_requeued_on_the_next_pass(
    db_session: Session, scripted, start_worker, engine, backend, code_repo_image, calc_task_payload
) -> None:
    """(issue 24) What compose does to a killed worker: the same name starts again at once, so its row
    beats fresh throughout. The controller's next pass requeues the episode the dead process leased —
    default settings, no deadline moved — and the run completes with one stored copy and no container."""
    policy, _ = scripted
    in_flight, release = threading.Event(), threading.Event()

    def stall_first_time(_: str) -> Reply:
        if not in_flight.is_set():
            in_flight.set()
            release.wait(120)
        return Reply(FIX[0])

    policy.scripts["restarted"] = [stall_first_time, *FIX[1:]]
    register_environment(db_session, spec=parse_spec(env_spec(code_repo_image)))
    db_session.add(Task(environment_name="calc", external_id="calc-restarted", payload=calc_task_payload,
                        instruction="Fix add(). [script:restarted]"))
    db_session.commit()
    run = create_run(db_session, config=RunConfig(name="restarted", model="scripted", purpose="eval", group_size=1,
                                                  batch_size=1, max_groups=1, environments=[{"name": "calc"}]))
    db_session.commit()
    controller = Controller(engine=engine, dispatcher=create_app(load_settings()), settings=ControllerConfig())
    name = f"restarted-{os.getpid()}"

    def incarnation() -> str | None:
        db_session.expire_all()
        return db_session.execute(select(Worker.incarnation).where(Worker.name == name)).scalar_one_or_none()

    first = start_worker(name)
    wait_for(lambda: incarnation() is not None, timeout=120, what="the worker to beat")
    before = incarnation()
    assert controller.step().dispatched == {run.id: 1}
    wait_for(in_flight.is_set, timeout=120, what="the worker to be mid-episode")
    episode_id = db_session.execute(select(Episode.id).where(Episode.run_id == run.id)).scalar_one()
    assert db_session.get(Episode, episode_id).worker_incarnation == before
    victim_containers = [info.id for info in backend.list(labels={L.WORKER: name})]
    assert victim_containers

    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    release.set()
    second = start_worker(name)
    wait_for(lambda: incarnation() not in (None, before), timeout=120, what="the restarted worker to beat")
    report = controller.step()
    assert (report.resent, report.orphaned) == (1, 1), report

    def ended() -> bool:
        db_session.expire_all()
        controller.step()
        return db_session.get(Run, run.id).status == "completed"

    wait_for(ended, timeout=240, what="the run to complete")
    controller.close()
    episode = db_session.get(Episode, episode_id)
    assert (episode.status, episode.termination_reason, episode.worker_incarnation) == (
        "completed", "submitted", incarnation())
    assert [(f["reason"], f["incarnation"]) for f in episode.failures] == [("worker_lost", before)]
    turns = db_session.execute(select(Turn.index).where(Turn.episode_id == episode_id)).scalars().all()
    assert sorted(turns) == [0, 1, 2, 3]  # one copy
    wait_for(lambda: not any(backend.get(cid) for cid in victim_containers), timeout=90, what="the orphan to be reaped")
    stop_group(second)
    assert backend.list(labels={L.WORKER: name}) == []
