"""(issue 50) compose.yaml, run for real by Debian's docker-compose 1.29: brought up as the operator's guide
says (docs/operations/production.md: the stores and the migration, a token, then the services), a short
eval run played through it (the API, the controller, a worker in a container driving the host's engine
through the mounted socket, the calc task's sandbox), the worker service restarted mid-episode (nothing
lost, nothing stored twice, its old sandboxes reaped), and taken down with nothing left: no container,
network or volume of the project, no sandbox its workers made.

The public images the file names cannot be pulled here: stand-ins built from Debian's packages take their
place through the file's variables (tests/compose/project.py); the GPU vLLM services are not started, the
scripted policy server (tests/compose/scripted-policy.yaml) serves in their place. `make test-compose`;
`make test` runs the short case (tests/test_compose.py: docker-compose reads the file)."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from core.net import free_port
from tests.compose.project import Project, crucible_image, standin_images
from tests.support.calc import FIX, env_spec
from tests.support.polling import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.compose, pytest.mark.xdist_group("docker-global"),
              pytest.mark.skipif(shutil.which("docker-compose") is None,
                                 reason="needs Debian's docker-compose (scripts/setup.sh installs it)")]

HERE = Path(__file__).resolve().parent
SCRIPT = "compose"
FIRST_REPLY_S = 20.0
"""The policy takes this long over an episode's first turn: the worker is restarted while it waits."""


@dataclass
class Stack:
    project: Project
    api_url: str
    token: str
    workers: list[str]
    """The worker containers' ids seen during the test (a sandbox's owner host is its worker's hostname)."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path: str, **params: object) -> dict:
        answer = httpx.get(f"{self.api_url}{path}", params=params, headers=self.headers, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def post(self, path: str, *, headers: dict[str, str] | None = None, **kwargs: object) -> httpx.Response:
        return httpx.post(f"{self.api_url}{path}", headers={**self.headers, **(headers or {})}, timeout=60,
                          **kwargs)  # type: ignore[arg-type]


def _sandboxes_of(hosts: list[str]) -> list[str]:
    """Containers on the machine's engine whose owner is a process of one of these hosts (worker containers)."""
    listed = subprocess.run(["docker", "ps", "-a", "--filter", "label=crucible.owner", "--format",
                             '{{.ID}} {{.Label "crucible.owner"}}'], capture_output=True, text=True, check=True)
    prefixes = tuple(f"{host[:12]}:" for host in hosts)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.split()[1].startswith(prefixes)]


def _exit_codes(project: Project) -> dict[str, int]:
    """{container name: exit code} of the project's stopped containers."""
    ids = project.containers()
    if not ids:
        return {}
    shown = subprocess.run(["docker", "inspect", "--format", "{{.Name}} {{.State.ExitCode}}", *ids],
                           capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(shown[::2], map(int, shown[1::2]), strict=True))


def _project_leftovers(project: Project) -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={project.name}"
    def ids(*command: str) -> list[str]:
        return subprocess.run(["docker", *command, "--filter", label, "-q"], capture_output=True, text=True,
                              check=True).stdout.split()
    return {"containers": ids("ps", "-a"), "networks": ids("network", "ls"), "volumes": ids("volume", "ls")}


@pytest.fixture(scope="module")
def stack(image_cache: Path, code_repo_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    images = standin_images(image_cache)
    image = crucible_image(images["CRUCIBLE_PYTHON_IMAGE"], cache_dir=image_cache)
    scripts = tmp_path_factory.mktemp("scripts")
    replies = [{"text": FIX[0], "delay_s": FIRST_REPLY_S}, *FIX[1:]]
    (scripts / "scripts.json").write_text(json.dumps({SCRIPT: replies}))
    scripts.chmod(0o755)
    port = free_port()
    project = Project(
        name=f"crucible-compose-{secrets.token_hex(4)}", extra=[HERE / "scripted-policy.yaml"],
        variables={**images, "CRUCIBLE_IMAGE": image, "CRUCIBLE_EXTRAS": "", "CRUCIBLE_API_PORT": str(port),
                   "POSTGRES_PASSWORD": secrets.token_urlsafe(12), "CRUCIBLE_POLICY_URLS": "http://policy:8000/v1",
                   "CRUCIBLE_TEST_SCRIPTS": str(scripts)})
    workers: list[str] = []
    try:
        # The operator's first run (docs/operations/production.md): the stores and the migration, a token, the rest.
        project.command("up", "-d", "postgres", "redis", "migrate")
        created = project.command("run", "--rm", "api", "token", "create", "admin", "-o", "json")
        token = json.loads(created.stdout[created.stdout.index("{"):])["token"]
        project.variables["CRUCIBLE_API_TOKEN"] = token
        project.command("up", "-d", "api", "controller", "worker", "policy")
        api_url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            try:
                return httpx.get(f"{api_url}/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, timeout=180, what="the api service to answer", detail=project.logs)
        workers += project.containers("worker")
        yield Stack(project=project, api_url=api_url, token=token, workers=workers)
    finally:
        stopped = project.command("stop", "--timeout", "60", check=False)
        codes = _exit_codes(project)
        down = project.command("down", "--volumes", "--remove-orphans", "--timeout", "60", check=False)
        assert stopped.returncode == 0 and down.returncode == 0, stopped.stderr + down.stderr
    # Each service stopped when told (exit 0), none killed at the end of its grace period (137).
    assert codes and set(codes.values()) == {0}, codes
    # Nothing left: the project's containers, networks, volumes, and every sandbox its workers made.
    assert _project_leftovers(project) == {"containers": [], "networks": [], "volumes": []}
    assert _sandboxes_of(workers) == [], "sandboxes left behind by the compose workers"


def test_a_short_run_through_compose_survives_a_worker_restart_mid_episode(stack: Stack, code_repo_image: str,
                                                                         calc_task_payload: dict) -> None:
    registered = stack.post("/v1/environments", json=env_spec(code_repo_image))
    assert registered.status_code == 201, registered.text
    line = json.dumps({"id": "calc-compose", "instruction": f"Fix add(). [script:{SCRIPT}]", "split": "train",
                       **calc_task_payload})
    uploaded = stack.post("/v1/environments/calc/tasks", content=line + "\n",
                          headers={"content-type": "application/x-ndjson"})
    assert uploaded.status_code == 201, uploaded.text
    launched = stack.post("/v1/runs", json={"name": "compose", "model": "scripted", "purpose": "eval", "group_size": 2,
                                            "batch_size": 1, "max_groups": 1, "environments": [{"name": "calc"}]})
    assert launched.status_code == 201, launched.text
    run_id = launched.json()["id"]

    def playing() -> list[dict]:
        return [e for e in stack.get("/v1/episodes", run_id=run_id)["data"] if e["status"] == "running"]

    wait_for(lambda: bool(playing()), timeout=300, what="an episode in play", detail=stack.project.logs)
    held = _sandboxes_of(stack.workers)
    assert held, "the worker holds its episodes' sandboxes on the host's engine"
    stack.project.command("restart", "--timeout", "5", "worker")  # SIGTERM, SIGKILL 5 s later: mid-episode
    stack.workers += [c for c in stack.project.containers("worker") if c not in stack.workers]

    def finished() -> bool:
        return stack.get(f"/v1/runs/{run_id}")["status"] in ("completed", "failed", "stopped")

    wait_for(finished, timeout=600, what="the run to finish", detail=stack.project.logs)
    episodes = stack.get("/v1/episodes", run_id=run_id)["data"]
    assert len(episodes) == 2 and {e["status"] for e in episodes} == {"completed"}, episodes
    for summary in episodes:
        episode = stack.get(f"/v1/episodes/{summary['id']}")
        assert episode["reward_components"]["hidden_tests"] == 1.0, episode
        assert [turn["index"] for turn in episode["turns"]] == [0, 1, 2, 3]  # one copy, never two
    lost = [f["reason"] for e in episodes for f in stack.get(f"/v1/episodes/{e['id']}")["failures"]]
    assert "worker_lost" in lost, lost  # the restart cut an episode short, and it was played again
    # The killed process's sandboxes are reaped by its successor (their owner process is gone).
    wait_for(lambda: not set(held) & set(_sandboxes_of(stack.workers)), timeout=120,
             what="the old worker's sandboxes to be reaped", detail=stack.project.logs)
