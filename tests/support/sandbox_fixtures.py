"""Fixtures for everything that runs sandboxes, one of each for the whole suite (a plugin of tests/conftest.py):
the real dockerd, the images built once, and the sandbox providers of the episode tests.

Images are built by content hash (a no-op when the tags exist); the debootstrap rootfs is cached in
CRUCIBLE_TEST_IMAGE_CACHE (default ~/.cache/crucible) so a machine pays for debootstrap only once.
No engine is a failure, not a skip: `make test` starts one. Only CRUCIBLE_TESTS_WITHOUT_DOCKER=1
turns these tests into skips, for a developer who knows what they are leaving out.

A test that uses any of these is marked `docker` (tests/conftest.py, FIXTURE_MARKS).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandboxes import InMemoryEventSink, SandboxBackend, make_backend
from sandboxes.errors import BackendUnavailable

if TYPE_CHECKING:
    from environments.sandboxes import DockerSandboxes


@pytest.fixture(scope="session")
def backend() -> SandboxBackend:
    docker_backend = make_backend("docker")
    try:
        docker_backend.ping()
    except BackendUnavailable as error:
        if os.environ.get("CRUCIBLE_TESTS_WITHOUT_DOCKER") == "1":
            pytest.skip(f"needs a running Docker engine: {error}")
        pytest.fail(f"these tests need a running Docker engine (make test starts one): {error}")
    return docker_backend


@pytest.fixture(scope="session")
def image_cache() -> Path:
    return Path(os.environ.get("CRUCIBLE_TEST_IMAGE_CACHE", Path.home() / ".cache" / "crucible"))


@pytest.fixture(scope="session")
def sandbox_images(backend: SandboxBackend, image_cache: Path) -> dict[str, str]:
    """{"base": tag, "code-repo": tag}, built once (cached by content hash)."""
    from environments.images import build_images

    return {b.name: b.tag for b in build_images(data_dir=image_cache)}


@pytest.fixture(scope="session")
def code_repo_image(sandbox_images: dict[str, str]) -> str:
    return sandbox_images["code-repo"]


@pytest.fixture
def events() -> InMemoryEventSink:
    return InMemoryEventSink()


@pytest.fixture
def sandboxes(backend: SandboxBackend, events: InMemoryEventSink) -> Iterator[DockerSandboxes]:
    """A worker's sandbox provider (no warm pool, at most 4), new for each test and closed after it; what it
    does is recorded in the test's `events`."""
    from environments.sandboxes import DockerSandboxes

    provider = DockerSandboxes(backend=backend, events=events, worker="test", min_size=0, max_size=4)
    yield provider
    provider.close()


@pytest.fixture(scope="module")
def module_sandboxes(request: pytest.FixtureRequest, backend: SandboxBackend,
                     image_cache: Path) -> Iterator[DockerSandboxes]:
    """One provider (at most 2) for a whole module, whose tests reuse its sandboxes: the worker named by the
    module's SANDBOX_WORKER. Only the code-repo image is built (a no-op when it is current)."""
    from environments.images import build_images
    from environments.sandboxes import DockerSandboxes

    build_images(names=["code-repo"], data_dir=image_cache)
    provider = DockerSandboxes(backend=backend, events=InMemoryEventSink(), worker=request.module.SANDBOX_WORKER,
                               min_size=0, max_size=2)
    yield provider
    provider.close()
