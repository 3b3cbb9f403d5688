"""Fixtures for episode tests: real dockerd sandboxes, a scripted vLLM-compatible policy server,
and a registered code_repo environment with one buggy-calculator task."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from core.models import Episode
from core.settings import get_settings
from environments.code_repo.task import CodeRepoTask, Solution, TestSpec, pack_directory
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from sandboxes import InMemoryEventSink
from task_workers.celery_app import create_app
from task_workers.context import DockerSandboxes, close_worker_context
from task_workers.policy.client import PolicyClient
from task_workers.policy.scripted import ScriptedPolicy, serve
from tests import factories
from tests.support.celery_worker import embedded_worker
from tests.task_workers.episode.calc_red import CALC, HIDDEN, PUBLIC, WEIGHTS

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
PUBLIC_TEST = "from calc import mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n"
HIDDEN_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"

FIX = [
    hermes_call("bash", command="cat calc.py"),
    hermes_call("edit_file", path="calc.py", old_str="return a - b", new_str="return a + b"),
    hermes_call("run_tests"),
    hermes_call("submit"),
]


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


@pytest.fixture(scope="session")
def code_repo_image(sandbox_images: dict[str, str]) -> str:
    return sandbox_images["code-repo"]


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedPolicy, str]]:
    policy = ScriptedPolicy()
    with serve(policy) as url:
        yield policy, url


def env_spec(image: str, **limits: object) -> dict:
    return {
        "name": "calc", "kind": "code_repo", "image": image,
        "sandbox": {"memory": "512m", "pids": 256, "workspace_size": "64m", "tmp_size": "64m", "max_lifetime_s": 900},
        "limits": {"max_turns": 6, "episode_timeout_s": 120, "tool_timeout_s": 20, "max_tool_errors": 3, **limits},
        "verifier": {"weights": {"rules": 0.1, "public_tests": 0.2, "hidden_tests": 0.7}},
    }


def make_episode(session: Session, *, image: str, payload: dict, script: str, **limits: object) -> int:
    """One environment version, one task naming `script`, one run, one group, one pending episode."""
    env, _ = register_environment(session, spec=parse_spec(env_spec(image, **limits)))
    task = factories.task(session, env, external_id=f"calc-{script}", instruction=f"Fix add(). [script:{script}]",
                          payload=json.loads(json.dumps(payload)))
    _, (episode_id,) = factories.pending_group(session, env=env, the_task=task, name=f"run-{script}")
    session.commit()
    return episode_id


@pytest.fixture
def sandboxes(backend) -> Iterator[DockerSandboxes]:
    provider = DockerSandboxes(backend=backend, events=InMemoryEventSink(), worker="test", min_size=0, max_size=4)
    yield provider
    provider.close()


@pytest.fixture
def policy_client(scripted) -> Iterator[PolicyClient]:
    client = PolicyClient(base_url=scripted[1], retries=1, backoff_s=0.05)
    yield client
    client.close()


# The red team's calc task (test_red_team.py, test_red_team_blinded.py): its payload, with a reference
# solution so that the hidden tests are blinded, and the reward of the plain wrong fix.
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
    """A real Celery worker thread consuming code_repo, pointed at the scripted policy server. Its reaper sweeps
    every crucible container on the machine: a test using it goes in xdist_group("docker-global")."""
    monkeypatch.setenv("CRUCIBLE_POLICY_URL", scripted[1])
    monkeypatch.setenv("CRUCIBLE_WORKER_NAME", CELERY_WORKER)
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
