"""Fixtures for the sandbox tests: the specs they make sandboxes of, and a no-leak guarantee. (The real
dockerd, the images built once and `events` are the suite's: tests/support/sandbox_fixtures.py.)

After the session, every container this test session made must be gone: the finalizer removes
leftovers by label (owner = this process, or the CLI test's env label) and then fails the session
if there were any. Containers of other processes on the machine are never touched.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

from sandboxes import ContainerInfo, SandboxSpec, make_backend
from sandboxes.errors import BackendUnavailable
from sandboxes.labels import ENV

SESSION_START = time.time()


@pytest.fixture(scope="session")
def base_spec(sandbox_images: dict[str, str]) -> SandboxSpec:
    """Small limits so faults hit them quickly."""
    return SandboxSpec(
        image=sandbox_images["base"], memory="384m", pids=128, workspace_size="64m", tmp_size="64m",
        home_size="16m", capture_size="16m", output_head="8k", output_tail="8k", command_timeout_s=20,
        max_lifetime_s=900,
    )


@pytest.fixture(scope="session")
def repo_spec(base_spec: SandboxSpec, sandbox_images: dict[str, str]) -> SandboxSpec:
    return base_spec.model_copy(update={"image": sandbox_images["code-repo"], "workspace_seed": "/opt/seed"})


CLI_ENV_LABEL = f"cli{os.getpid()}"  # test_sandbox_cli.py's detached sandboxes (per process: xdist workers; short: `ls` shows it in a table column)


def _made_by_this_session(info: ContainerInfo) -> bool:
    """Owned by this pytest process, or a detached sandbox our CLI test made (never anyone else's)."""
    owner = info.owner
    if owner.host != socket.gethostname() or info.created_at < SESSION_START - 2:
        return False
    return owner.pid == os.getpid() or (owner.pid is None and info.labels.get(ENV) == CLI_ENV_LABEL)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_containers(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    try:
        docker_backend = make_backend("docker")
        mine = [info for info in docker_backend.list() if _made_by_this_session(info)]
    except BackendUnavailable:
        return
    for info in mine:
        docker_backend.remove(info.id)
    assert not mine, f"sandbox containers leaked by the test session: {[i.sandbox_id for i in mine]}"
