"""(issue 24) A dropped database is survived: every connection of a live worker, controller and API to the
test's own database is terminated (pg_terminate_backend) while an episode is mid-flight, twice. All three
keep running, the run completes, the episode is stored once. The broker is Celery's SQLAlchemy
transport on that same database (the default), so its connections are cut too."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from api.services.tokens import create_token
from core.models import Episode, Run, Task, Turn
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.policy.scripted import Reply
from tests.api.live_server import crucible_env, live_api
from tests.support.calc import FIX, env_spec
from tests.support.processes import launch_calc_eval, spawn_crucible, stop_group

# The worker's reaper sweeps every crucible container on the machine: with the other tests that do.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]


def _terminate_everyone_else(session: Session) -> int:
    """Every other connection to this test's database, cut (as a database restart or a proxy would)."""
    cut = session.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar_one()
    session.commit()
    return int(cut)


def test_every_process_weathers_its_database_connections_cut_mid_run(
    db_session: Session, scripted, code_repo_image, calc_task_payload, tmp_path: Path
) -> None:
    policy, url = scripted
    in_flight, release = threading.Event(), threading.Event()

    def stall(_: str) -> Reply:
        in_flight.set()
        release.wait(120)  # mid-episode: the worker holds its lease and a sandbox while we cut
        return Reply(FIX[1])

    policy.scripts["cut"] = [FIX[0], stall, *FIX[2:]]
    register_environment(db_session, spec=parse_spec(env_spec(code_repo_image)))
    db_session.add(Task(environment_name="calc", external_id="calc-cut", instruction="Fix add(). [script:cut]",
                        payload=calc_task_payload))
    _, token = create_token(db_session, name="database faults")
    db_session.commit()
    settings = {"policy_url": url, "data_dir": str(tmp_path), "worker_name": f"cut-{os.getpid()}",
                "sandbox_pool_min": "0", "worker_concurrency": "1"}
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, *args: str) -> None:
        processes.append(spawn_crucible(tmp_path / f"{name}.log", *args, env=crucible_env(**settings)))

    def logs() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in tmp_path.glob("*.log"))

    try:
        with live_api(tmp_path, **settings) as api:
            headers = {"Authorization": f"Bearer {token}"}
            spawn("worker", "worker", "-Q", "code_repo")
            spawn("controller", "controller", "--poll", "0.5")
            run_id = launch_calc_eval(api.url, headers=headers, name="cut")
            assert in_flight.wait(180), logs()
            assert _terminate_everyone_else(db_session) > 0  # the worker's, the controller's, the broker's, the API's
            release.set()
            time.sleep(1.0)
            _terminate_everyone_else(db_session)  # again, while the episode is stored and the run finishes
            status = ""
            for _ in range(1200):  # polls until the run ends; the test's timeout bounds it
                db_session.expire_all()
                status = db_session.execute(select(Run.status).where(Run.id == run_id)).scalar_one()
                if status in ("completed", "failed"):
                    break
                time.sleep(0.25)
            assert status == "completed", (status, logs())
            assert [p.poll() for p in processes] == [None, None], logs()  # both still running
            assert httpx.get(f"{api.url}/v1/runs/{run_id}", headers=headers, timeout=30).status_code == 200
    finally:
        for process in processes:
            stop_group(process)
    episode = db_session.execute(select(Episode).where(Episode.run_id == run_id)).scalar_one()
    assert (episode.status, episode.termination_reason) == ("completed", "submitted"), episode.failures
    turns = db_session.execute(select(Turn.index).where(Turn.episode_id == episode.id)).scalars().all()
    assert sorted(turns) == [0, 1, 2, 3]  # one copy
