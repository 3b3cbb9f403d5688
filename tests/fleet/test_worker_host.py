"""(issue 50) A worker host of its own — a network namespace on a bridge, with its own Docker engine — gets
the images it never built from the control host's registry, by digest, over the bridge; its loopback is its
own. The short case runs in `make test`; the sandbox on the pulled base image in `make test-fleet`.

The registry's storage is served twice: on loopback, for the control host's engine that pushes (every
engine trusts 127.0.0.0/8 over plain HTTP), and on the bridge address, for the worker hosts (their engines
started trusting it). Each host names the registry as it reaches it (environments/images/registry.py)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from environments.images.registry import catalogued, push_images
from sandboxes import InMemoryEventSink, SandboxBackend, SandboxPool, SandboxSpec
from tests.fleet.hosts import Fleet, Host
from tests.support.registry import serve_registry, tiny_image

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("fleet"),
              pytest.mark.skipif(shutil.which("docker-registry") is None,
                                 reason="needs Debian's docker-registry (scripts/setup.sh installs it)")]
REPOSITORY = "crucible-test/fleet"


@dataclass
class World:
    fleet: Fleet
    worker: Host
    pushed_to: str
    """The registry as the control host reaches it (loopback)."""
    reached_at: str
    """The same registry as a worker host reaches it (the bridge)."""


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    storage = tmp_path / "registry"
    with Fleet() as fleet, serve_registry(storage) as pushed_to, serve_registry(storage, host=fleet.address) as reached:
        yield World(fleet=fleet, worker=fleet.host("w1"), pushed_to=pushed_to, reached_at=reached)


def test_a_worker_host_pulls_an_image_it_never_built_from_the_control_hosts_registry(
        db_session: Session, world: World) -> None:
    # Its loopback is its own: the machine's Postgres (127.0.0.1:5432) is not there; the control host is,
    # at its bridge address.
    probe = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)"
    assert world.worker.run([sys.executable, "-c", probe, "127.0.0.1", "5432"]).returncode != 0
    host, port = world.reached_at.split(":")
    assert world.worker.run([sys.executable, "-c", probe, host, port]).returncode == 0
    engine = world.worker.engine(insecure=[world.reached_at]).backend()
    with tiny_image(f"{REPOSITORY}-tiny") as image:
        [pushed] = push_images([image], registry=world.pushed_to)
        assert engine.api.images(name=image) == []  # that host never built it
        reference = catalogued(image, registry=world.reached_at)
        assert reference == f"{world.reached_at}/{REPOSITORY}-tiny@{pushed.reference.rpartition('@')[2]}"
        engine.pull_image(reference, as_image=image)
        assert reference in engine.api.inspect_image(image)["RepoDigests"]


@pytest.mark.fleet
def test_a_sandbox_runs_on_a_worker_hosts_engine_from_the_pulled_base_image(
        db_session: Session, world: World, backend: SandboxBackend, sandbox_images: dict[str, str]) -> None:
    """The base image pushed from the control host (~20 s here), pulled by the worker host's engine when its
    first sandbox is made (a `pull` event), and the sandbox run there — not on the control host's engine."""
    base = sandbox_images["base"]
    push_images([base], registry=world.pushed_to)
    engine = world.worker.engine(insecure=[world.reached_at]).backend()
    spec = SandboxSpec(image=base, memory="256m", pids=128, workspace_size="16m", tmp_size="16m", home_size="16m",
                       capture_size="16m", command_timeout_s=20)
    events = InMemoryEventSink()
    pool = SandboxPool(spec=spec, backend=engine, events=events, min_size=0, max_size=1,
                       images=lambda image: catalogued(image, registry=world.reached_at))
    with pool, pool.lease() as sandbox:
        assert sandbox.step("echo on-the-worker-host").stdout == "on-the-worker-host\n"
        assert [info.sandbox_id for info in engine.list()] == [sandbox.id]
        assert sandbox.id not in {info.sandbox_id for info in backend.list()}  # not on the control host's engine
    assert [event.detail["image"] for event in events.events if event.kind.value == "pull"] == [base]
    assert engine.list() == []
