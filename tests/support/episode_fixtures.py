"""Fixtures for playing episodes, one of each for the whole suite (a plugin of tests/conftest.py): a scripted
vLLM-compatible policy server and a client of it, the calc tasks' payloads (tests/support/calc.py,
tests/support/calc_red.py), and a real Celery worker; with `wait_ended`, which polls the store for an
episode's end."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from sqlalchemy.orm import Session

from core.models import Episode
from core.settings import get_settings
from environments.code_repo.task import CodeRepoTask, Solution, TestSpec, pack_directory
from tests.support.calc import BUGGY, HIDDEN_TEST, PUBLIC_TEST
from tests.support.calc_red import CALC, HIDDEN, PUBLIC, WEIGHTS

if TYPE_CHECKING:
    from task_workers.policy.client import PolicyClient
    from task_workers.policy.scripted import ScriptedPolicy


@pytest.fixture(scope="session")
def calc_task_payload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    repo = tmp_path_factory.mktemp("calc")
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(PUBLIC_TEST)
    task = CodeRepoTask(
        repo=pack_directory(repo),
        public_tests=TestSpec(paths=["tests"], timeout_s=60),
        hidden_tests=TestSpec(paths=["test_hidden.py"], files={"test_hidden.py": HIDDEN_TEST}, timeout_s=60),
    )
    return task.model_dump(mode="json")


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedPolicy, str]]:
    from task_workers.policy.scripted import ScriptedPolicy, serve

    policy = ScriptedPolicy()
    with serve(policy) as url:
        yield policy, url


@pytest.fixture
def policy_client(scripted) -> Iterator[PolicyClient]:
    from task_workers.policy.client import PolicyClient

    client = PolicyClient(base_url=scripted[1], retries=1, backoff_s=0.05)
    yield client
    client.close()


# The red team's calc task (tests/environments/code_repo/test_red_team.py, test_red_team_blinded.py): its payload,
# with a reference solution so that the hidden tests are blinded, and the reward of the plain wrong fix.
@pytest.fixture(scope="session")
def calc_payload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    repo = tmp_path_factory.mktemp("calc-red")
    (repo / "calc.py").write_text(CALC)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(PUBLIC)
    task = CodeRepoTask(repo=pack_directory(repo), public_tests=TestSpec(paths=["tests"], timeout_s=60),
                        hidden_tests=TestSpec(paths=["test_hidden.py"], files={"test_hidden.py": HIDDEN}, timeout_s=60),
                        solution=Solution(files={"calc.py": CALC.replace("a - b", "a + b")}))
    return task.model_dump(mode="json")


@pytest.fixture(scope="session")
def wrong_fix_reward() -> float:
    return WEIGHTS["rules"] + WEIGHTS["public_tests"]  # rules pass, mul still passes, no hidden test passes


CELERY_WORKER = f"celery-test-worker-{os.getpid()}"  # per process: another xdist worker runs its own


@pytest.fixture
def celery_worker(scripted, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A real Celery worker thread consuming code_repo and agent_program, pointed at the scripted policy server. Its reaper sweeps
    every crucible container on the machine: a test using it goes in xdist_group("docker-global")."""
    from task_workers.celery_app import create_app
    from task_workers.context import close_worker_context
    from tests.support.celery_worker import embedded_worker

    monkeypatch.setenv("CRUCIBLE_POLICY_URL", scripted[1])
    monkeypatch.setenv("CRUCIBLE_WORKER_NAME", CELERY_WORKER)
    monkeypatch.setenv("CRUCIBLE_SANDBOX_POOL_MIN", "0")
    get_settings.cache_clear()
    app = create_app()
    app.conf.task_default_queue = "code_repo"
    try:
        with embedded_worker(app, queues=["code_repo", "agent_program"]):
            yield app
    finally:
        close_worker_context()
        get_settings.cache_clear()


def wait_ended(session: Session, episode_id: int, timeout: float = 240) -> Episode:
    """The episode once it has ended (completed or failed), polled from the store."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        session.expire_all()
        episode = session.get(Episode, episode_id)
        if episode is not None and episode.status in ("completed", "failed"):
            return episode
        time.sleep(0.3)
    raise AssertionError(f"episode {episode_id} did not end in {timeout}s")
