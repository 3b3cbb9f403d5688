"""(issue 50) A training run across a fleet of hosts on one machine (`make test-fleet`):

    control  10.77.0.2   Postgres, Redis (the broker), the registry, `crucible api`, `crucible controller`
    policy   10.77.0.3   `crucible serve` (vLLM on CPU, the tiny model)
    trainer  10.77.0.4   `crucible trainer`
    w1, w2   10.77.0.5-6 a Docker engine each, and `crucible worker`

Each host is a network namespace on a bridge: its loopback is its own, so a process told 127.0.0.1 for a
service of another host reaches nothing there, and the run completing shows every process was given the
others' addresses. The worker hosts never built an image: their first sandbox pulls the code-repo image
from the control host's registry by digest (a `pull` sandbox event on each). While the run's episodes hold
their sandboxes (the policy paused, so each waits on its first turn), `crucible sandbox ls/exec --api` on
the control host reach sandboxes of both worker hosts through the API and the worker that owns each; a
revoked token is refused. Afterwards nothing of the fleet is left (hosts.cleanup).

The image push is the build machine's (this one's own engine, through the registry's loopback door: every
engine trusts plain HTTP on 127.0.0.0/8); the worker hosts reach the same storage at the control host's
address."""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from api.services.tokens import create_token, revoke_token
from core.models import Episode, Run, SandboxEvent, TrainingStep, Worker
from core.models.worker import alive
from environments.read_number.task import insert_tasks
from environments.service import register_environment
from environments.spec import parse_spec
from recipes.common import RecipeSettings
from recipes.demo import ENV_SPEC as DEMO_ENV_SPEC
from recipes.demo import demo_tasks, warm_up
from tests.fleet.hosts import PREFIX, Fleet, Host
from tests.fleet.hosts import Engine as DockerEngine
from tests.fleet.load import ControlLoad
from tests.fleet.services import (
    ROOT,
    Service,
    crucible,
    fleet_env,
    postgres,
    redis,
    start,
    state_dir,
    stop,
    tail,
    wait_until,
)
from tests.support.registry import serve_registry

pytestmark = [pytest.mark.docker, pytest.mark.fleet, pytest.mark.xdist_group("fleet"),
              pytest.mark.skipif(shutil.which("docker-registry") is None,
                                 reason="needs Debian's docker-registry (scripts/setup.sh installs it)")]

ENV_NAME = "fleet-read-number"
ENV_SPEC = {**DEMO_ENV_SPEC, "name": ENV_NAME}
SETTINGS = RecipeSettings(sft_steps=200, sloppy_steps=10, train_tasks=8, test_tasks=4, group_size=4, batch_size=2)
"""The demo's test settings: after this warm-up a group's rewards differ, so the run trains (tests/recipes/test_demo.py)."""
GROUPS, GROUP_SIZE = 4, SETTINGS.group_size
JUDGED_ENV = "fleet-judged"
WORKERS = ("w1", "w2")
LOAD_EPISODES = 96


def judged_spec(judge_url: str) -> dict:
    """The fleet's environment with a pointwise judge on the judge host (a stand-in that scores 7 of 10)."""
    return {**ENV_SPEC, "name": JUDGED_ENV, "verifier": {
        "weights": {**ENV_SPEC["verifier"]["weights"], "judge": 0.5},
        "judge": {"url": judge_url, "model": "judge", "rubric": "Reads the file before it answers.", "retries": 2}}}


@dataclass
class World:
    fleet: Fleet
    hosts: dict[str, Host]
    services: dict[str, Service]
    database: Engine
    api_url: str
    token: str
    served_dir: Path
    settings: dict[str, str]
    """Every process's settings (the other hosts by address); a host adds its own."""

    def logs(self) -> str:
        return "\n".join(tail(service, 2000) for service in self.services.values())

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def launch(self, name: str, **config: object) -> int:
        """A run of the served model launched through the API (POST /v1/runs); its id."""
        launched = httpx.post(f"{self.api_url}/v1/runs", headers=self.headers, timeout=60,
                              json={"name": name, "model": str(self.served_dir), **config})
        assert launched.status_code == 201, launched.text
        return int(launched.json()["id"])

    def worker_env(self, host: Host, engine: DockerEngine) -> dict[str, str]:
        return worker_env(self.settings, host, engine)

    def control(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        """`crucible ARGS` on the control host, as an operator there runs it."""
        env = fleet_env(**self.settings, api_url=self.api_url, api_token=token or self.token)
        return self.hosts["control"].run([sys.executable, "-m", "cli.main", *args], env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def warm_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after the demo's warm-up (SFT on demonstrations of the read_number tasks)."""
    workdir = tmp_path_factory.mktemp("warm")
    shutil.copytree(tiny_model_dir, workdir / "tiny")
    return warm_up(SETTINGS, workdir=workdir, console=Console(file=io.StringIO()))


@pytest.fixture(scope="module")
def world(warm_model: Path, code_repo_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    logs = tmp_path_factory.mktemp("fleet-logs")
    with Fleet() as fleet:
        hosts = {name: fleet.host(name) for name in ("control", "policy", "trainer", *WORKERS, "judge")}
        control = hosts["control"]
        services: dict[str, Service] = {}
        services["postgres"], database_url = postgres(control, logs=logs)
        services["redis"], broker_url = redis(control, logs=logs)
        storage = state_dir(control, "registry") / "storage"
        with serve_registry(storage) as pushed_to, \
                serve_registry(storage, host=control.address, port=5000, popen=control.popen) as registry:
            judge = hosts["judge"]
            services["judge"] = start(judge, "judge", [sys.executable, "-m", "tests.support.standin_judge",
                                                       judge.address, "8001", "7"], logs=logs, env=fleet_env())
            judge_url = f"http://{judge.address}:8001/v1"
            settings = {"database_url": database_url, "broker_url": broker_url, "image_registry": registry,
                        "reward_servers": judge_url}
            migrated = control.run([sys.executable, "-m", "cli.main", "db", "upgrade"], env=fleet_env(**settings), cwd=ROOT)
            assert migrated.returncode == 0, migrated.stdout + migrated.stderr
            database = create_engine(database_url, pool_pre_ping=True)
            # The build machine pushes the image it built; no worker host has it.
            pushed = subprocess.run([sys.executable, "-m", "cli.main", "images", "push", code_repo_image,
                                     "--registry", pushed_to], env=fleet_env(**settings), capture_output=True, cwd=ROOT,
                                    text=True, timeout=600)
            assert pushed.returncode == 0, pushed.stdout + pushed.stderr
            with Session(database) as session:
                register_environment(session, spec=parse_spec(ENV_SPEC))
                register_environment(session, spec=parse_spec(judged_spec(judge_url)))
                train, test = demo_tasks(SETTINGS)
                insert_tasks(session, environment=ENV_NAME, tasks=train + test)
                insert_tasks(session, environment=JUDGED_ENV, tasks=train + test)
                _, token = create_token(session, name="fleet-operator")
                session.commit()
            served_dir = Path(shutil.copytree(warm_model, state_dir(hosts["policy"], "model") / "model"))
            policy = hosts["policy"]
            services["policy"] = crucible(policy, "policy", "serve", str(served_dir), "--host", policy.address,
                                          "--port", "8000", "--max-model-len", "1024", "--startup-timeout", "900",
                                          "--log-file", str(logs / "vllm.log"), env=fleet_env(), logs=logs)
            policy_url = f"http://{policy.address}:8000/v1"
            settings |= {"policy_url": policy_url, "policy_tokenizer": str(served_dir)}
            api_url = f"http://{control.address}:8080"
            services["api"] = crucible(control, "api", "api", "--host", control.address, "--port", "8080",
                                       env=fleet_env(**settings), logs=logs)
            services["controller"] = crucible(control, "controller", "controller", "--poll", "0.5",
                                              env=fleet_env(**settings), logs=logs)
            for name in WORKERS:
                host = hosts[name]
                services[name] = crucible(host, name, "worker", "-Q", "celery,read_number", logs=logs,
                                          env=worker_env(settings, host, host.engine(insecure=[registry])))
            wait_until(lambda: httpx.get(f"{api_url}/healthz", timeout=2).status_code == 200, what="the API",
                       service=services["api"])
            wait_until(lambda: httpx.get(f"http://{policy.address}:8000/health", timeout=2).status_code == 200,
                       what="vLLM on the policy host", service=services["policy"], timeout_s=900)
            for name in WORKERS:
                wait_until(partial(_worker_alive, database, name), what=f"worker {name}'s heartbeat",
                           service=services[name], timeout_s=300)
            world = World(fleet=fleet, hosts=hosts, services=services, database=database, api_url=api_url,
                          token=token, served_dir=served_dir, settings=settings)
            try:
                yield world
            finally:
                for name in ("trainer", "controller", *WORKERS, "api", "policy", "judge"):
                    if name in services:
                        stop(services[name])
                database.dispose()
                for name in ("redis", "postgres"):
                    stop(services[name], grace_s=30, sig=signal.SIGINT)  # a fast shutdown: clients cut
    assert not [line for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
                if line.startswith(f"{PREFIX}-")], "a namespace of the fleet outlived it"


def worker_env(settings: dict[str, str], host: Host, engine: DockerEngine) -> dict[str, str]:
    """A worker host's settings: the fleet's, its own engine, its name, its control address."""
    return fleet_env(**settings, DOCKER_HOST=f"unix://{engine.socket}", worker_name=host.name,
                     worker_concurrency="2", sandbox_pool_min="0", sandbox_pool_max="4",
                     worker_control_address=f"{host.address}:0", data_dir=str(state_dir(host, "data")))


def _worker_alive(database: Engine, name: str, *, other_than: str | None = None) -> bool:
    """The worker beats (an incarnation other than `other_than`) and serves its sandboxes."""
    with Session(database) as session:
        row = session.execute(select(Worker.incarnation, Worker.control_url).where(Worker.name == name, alive())).first()
        return row is not None and row.control_url is not None and row.incarnation != other_than


def _incarnation(database: Engine, name: str) -> str | None:
    with Session(database) as session:
        return session.execute(select(Worker.incarnation).where(Worker.name == name)).scalar_one_or_none()


def _vllm(world: World, route: str) -> None:
    response = httpx.post(f"http://{world.hosts['policy'].address}:8000/{route}", timeout=60)
    assert response.status_code == 200, response.text


def test_a_training_run_plays_on_both_worker_hosts_and_is_debugged_from_the_control_host(world: World) -> None:
    _vllm(world, "pause?mode=keep")  # every episode waits on its first turn, its sandbox leased
    try:
        run_id = world.launch("fleet-train", seed=SETTINGS.seed, environments=[{"name": ENV_NAME}], group_size=GROUP_SIZE,
                              batch_size=2, max_groups=GROUPS, mode="async", max_staleness=1,
                              sampling={"temperature": 1.0})
        trainer_host = world.hosts["trainer"]
        world.services["trainer"] = crucible(
            trainer_host, "trainer", "trainer", "--run", str(run_id), "--policy-url", world.settings["policy_url"],
            "--policy-dir", str(world.served_dir), "--checkpoint-dir", str(state_dir(trainer_host, "checkpoints")),
            "--poll", "0.5", env=fleet_env(**world.settings), logs=world.services["api"].log.parent)

        # Sandboxes on both worker hosts, leased to the run, seen from the control host through the API.
        def leased_on_both() -> bool:
            listed = world.control("sandbox", "ls", "--api", "--run", str(run_id), "-o", "json")
            rows = json.loads(listed.stdout)["data"] if listed.returncode == 0 else []
            return {row["worker"] for row in rows} == set(WORKERS)

        wait_until(leased_on_both, what="sandboxes leased to the run on both worker hosts",
                   service=world.services["controller"], timeout_s=600)
        rows = json.loads(world.control("sandbox", "ls", "--api", "--run", str(run_id), "-o", "json").stdout)["data"]
        for worker in WORKERS:
            sandbox = next(row["sandbox_id"] for row in rows if row["worker"] == worker)
            ran = world.control("sandbox", "exec", "--api", sandbox, "--", "cat number.txt; hostname")
            assert ran.returncode == 0 and ran.stdout.strip().endswith("sandbox"), ran.stdout + ran.stderr
        with Session(world.database) as session:
            revoked, plaintext = create_token(session, name="fleet-revoked")
            session.commit()
            revoke_token(session, ref=revoked.prefix)
            session.commit()
        refused = world.control("sandbox", "exec", "--api", rows[0]["sandbox_id"], "--", "id", token=plaintext)
        assert refused.returncode != 0 and "401" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    finally:
        _vllm(world, "resume")
    status = _wait_finished(world, run_id)
    assert status == "completed", world.logs()
    trainer = world.services.pop("trainer")
    assert trainer.process.wait(300) == 0, tail(trainer)  # it ends with its run

    with Session(world.database) as session:
        episodes = session.execute(select(Episode).where(Episode.run_id == run_id)).scalars().all()
        assert len(episodes) == GROUPS * GROUP_SIZE  # none lost, none stored twice
        assert {episode.status for episode in episodes} == {"completed"}
        assert {episode.worker for episode in episodes} == set(WORKERS), [e.worker for e in episodes]
        pulls = session.execute(select(SandboxEvent.worker, SandboxEvent.detail).where(
            SandboxEvent.kind == "pull")).all()
        assert {worker for worker, _ in pulls} == set(WORKERS)
        assert all(detail["reference"].startswith(f"{world.settings['image_registry']}/") for _, detail in pulls)
        consumed = session.execute(select(func.count()).select_from(Episode).where(
            Episode.run_id == run_id, Episode.advantage.is_not(None))).scalar_one()
        steps = session.execute(select(func.count()).select_from(TrainingStep).where(
            TrainingStep.run_id == run_id)).scalar_one()
        published = session.get(Run, run_id).policy_version  # type: ignore[union-attr]
    # The trainer host trained and pushed its weights to the policy host, which served them after the probe.
    assert steps >= 1 and consumed >= GROUP_SIZE and published >= 1, (steps, consumed, published)


def _held(world: World, run_id: int, worker: str) -> list[int]:
    with Session(world.database) as session:
        return list(session.execute(select(Episode.id).where(
            Episode.run_id == run_id, Episode.worker == worker, Episode.status == "running")).scalars())


def _wait_finished(world: World, run_id: int) -> str:
    deadline = time.monotonic() + 1800  # a bound on waiting, not a timing claim
    while True:
        with Session(world.database) as session:
            status = session.get(Run, run_id).status  # type: ignore[union-attr]
        if status in ("completed", "failed"):
            return status
        for name, service in world.services.items():  # the trainer ends with its run, and may see it first
            assert service.process.poll() in ((None, 0) if name == "trainer" else (None,)), \
                f"{name} exited ({service.process.returncode}):\n{world.logs()}"
        assert time.monotonic() < deadline, f"run {run_id} is still {status}:\n{world.logs()}"
        time.sleep(1.0)


def _doctor_hosts(world: World) -> dict[str, dict]:
    ran = world.control("doctor", "-o", "json")
    return {row["name"]: row for row in json.loads(ran.stdout) if row["name"].startswith("worker host ")}


def test_the_control_planes_load_is_counted_while_both_worker_hosts_play(world: World) -> None:
    """An eval run of LOAD_EPISODES episodes at the fleet's concurrency (2 worker hosts × 2 episodes at once):
    the control plane's load counted over it (tests/fleet/load.py), per episode and per turn too, the
    figures docs/operations/scale.md rests on."""
    with ControlLoad(database=world.database, broker_url=world.settings["broker_url"], api_url=world.api_url,
                     headers=world.headers, path="/v1/runs?limit=20") as load:
        run_id = world.launch("fleet-load", purpose="eval", group_size=1, batch_size=1, max_groups=LOAD_EPISODES,
                              environments=[{"name": ENV_NAME}])
        assert _wait_finished(world, run_id) == "completed", world.logs()
    figures = load.figures()
    with Session(world.database) as session:
        played = session.execute(select(Episode.worker, Episode.num_turns).where(
            Episode.run_id == run_id, Episode.status == "completed")).all()
    workers = [worker for worker, _ in played]
    turns = sum(count for _, count in played)
    assert len(played) == LOAD_EPISODES and set(workers) == set(WORKERS)
    assert figures["broker_messages"] >= LOAD_EPISODES and figures["postgres_commits"] > 0 and figures["api_requests"]
    print(json.dumps({"episodes": len(played), "turns": turns, **figures,
                      "postgres_commits_per_episode": round(figures["postgres_commits"] / len(played), 1),
                      "postgres_rows_per_episode": round(figures["postgres_rows_written"] / len(played), 1),
                      "episodes_per_s_by_host": {worker: round(workers.count(worker) / figures["seconds"], 3)
                                                 for worker in WORKERS}}))


def test_the_judge_host_cut_off_for_60_s_mid_run_costs_no_episode(world: World) -> None:
    """The judge's host is cut off the network for 60 s while a run's episodes are in play (the policy held
    until it is cut, so that they end during the outage): they wait, `scoring`, with their turns; once it is
    back each is judged from its stored turns — every episode scored, none `judge_error`, none played again
    (one sandbox lease each)."""
    judge = world.hosts["judge"]
    _vllm(world, "pause?mode=keep")
    try:
        run_id = world.launch("fleet-judge-cut", purpose="eval", group_size=1, batch_size=1, max_groups=8,
                              environments=[{"name": JUDGED_ENV}])
        wait_until(lambda: bool(_held(world, run_id, "w1") or _held(world, run_id, "w2")),
                   what="an episode in play", service=world.services["controller"], timeout_s=300)
        cut_at = time.monotonic()
        world.fleet.cut(judge)
    finally:
        _vllm(world, "resume")
    try:
        wait_until(lambda: _count(world, run_id, status="scoring") > 0, what="an episode awaiting its judge",
                   service=world.services["controller"], timeout_s=55)
        time.sleep(max(0.0, 60 - (time.monotonic() - cut_at)))
        waiting = _count(world, run_id, status="scoring")
    finally:
        world.fleet.cut(judge, off=False)
    assert waiting > 0
    assert _wait_finished(world, run_id) == "completed", world.logs()
    with Session(world.database) as session:
        episodes = session.execute(select(Episode).where(Episode.run_id == run_id)).scalars().all()
    assert len(episodes) == 8 and {episode.status for episode in episodes} == {"completed"}
    assert not [e.id for e in episodes if e.termination_reason == "judge_error"]
    assert all(episode.reward_components.get("judge") == pytest.approx(0.7)  # the judge's score (7 of 10)
               for episode in episodes if not episode.flags), [(e.reward_components, e.flags) for e in episodes]
    # Played once each: the rescoring leased no sandbox. (A worker writes its sandbox events in batches,
    # every 2 s: the last ones may land after the run completes.)
    wait_until(lambda: set(_leases(world, run_id)) == {episode.id for episode in episodes},
               what="every episode's lease event", service=world.services["controller"], timeout_s=60)
    assert _leases(world, run_id) == {episode.id: 1 for episode in episodes}


def _leases(world: World, run_id: int) -> dict[int, int]:
    with Session(world.database) as session:
        return {episode: int(count) for episode, count in session.execute(
            select(SandboxEvent.episode_id, func.count()).where(
                SandboxEvent.run_id == run_id, SandboxEvent.kind == "acquire", SandboxEvent.episode_id.is_not(None))
            .group_by(SandboxEvent.episode_id)).all() if episode is not None}


def _count(world: World, run_id: int, *, status: str) -> int:
    with Session(world.database) as session:
        return int(session.execute(select(func.count()).select_from(Episode).where(
            Episode.run_id == run_id, Episode.status == status)).scalar_one())


def test_a_worker_host_lost_mid_run_loses_no_episode_and_comes_back_clean(world: World) -> None:
    """w2 is lost (its worker, its engine and its sandboxes SIGKILLed, its network gone) while it holds
    episodes: the controller requeues them and w1 completes them, none lost or stored twice; `crucible
    doctor` and the dashboard show the host gone. It comes back with its disk: the old incarnation's
    containers are gone before its worker takes work, and it shows up again."""
    lost = world.hosts["w2"]
    _vllm(world, "pause?mode=keep")
    try:
        run_id = world.launch("fleet-host-lost", purpose="eval", group_size=1, batch_size=1, max_groups=6,
                              environments=[{"name": ENV_NAME}])
        wait_until(lambda: bool(_held(world, run_id, "w1")) and bool(_held(world, run_id, "w2")),
                   what="episodes running on both worker hosts", service=world.services["controller"], timeout_s=600)
        held = _held(world, run_id, "w2")
        [engine] = lost.engines
        disk = engine.root
        before = [info.sandbox_id for info in engine.backend().list()]
        assert before  # its sandboxes, leased to the episodes it holds
        incarnation = _incarnation(world.database, "w2")
        world.services.pop("w2")
        world.fleet.lose(lost)
    finally:
        _vllm(world, "resume")
    assert _wait_finished(world, run_id) == "completed", world.logs()

    with Session(world.database) as session:
        episodes = session.execute(select(Episode).where(Episode.run_id == run_id)).scalars().all()
        assert len(episodes) == 6 and {episode.status for episode in episodes} == {"completed"}
        requeued = [episode for episode in episodes if episode.id in held]
        assert {episode.worker for episode in requeued} == {"w1"} and all(e.attempts >= 2 for e in requeued)
    gone = _doctor_hosts(world)[f"worker host {lost.namespace}"]
    assert not gone["ok"] and gone["detail"].startswith("gone: no beat for"), gone
    page = httpx.get(f"{world.api_url}/", headers=world.headers, timeout=30)
    row = page.text[page.text.index(lost.namespace):]
    assert "<strong>gone</strong>" in row[:row.index("</tr>")]

    # Back, with its disk: nothing of the old incarnation left once its worker beats.
    world.fleet.restore(lost)
    engine = lost.engine(insecure=[world.settings["image_registry"]], root=disk)
    world.services["w2"] = crucible(lost, "w2-back", "worker", "-Q", "celery,read_number",
                                    logs=world.services["api"].log.parent, env=world.worker_env(lost, engine))
    wait_until(partial(_worker_alive, world.database, "w2", other_than=incarnation), what="w2's worker back", service=world.services["w2"],
               timeout_s=300)
    left = {info.sandbox_id for info in engine.backend().list()} & set(before)
    assert not left, f"containers of the lost incarnation left on the host come back: {left}"
    assert _doctor_hosts(world)[f"worker host {lost.namespace}"]["ok"]
