"""Fixtures for everything that runs sandboxes: the real dockerd and the images, built once.

Images are built by content hash (a no-op when the tags exist); the debootstrap rootfs is cached in
CRUCIBLE_TEST_IMAGE_CACHE (default ~/.cache/crucible) so a machine pays for debootstrap only once.
No engine is a failure, not a skip: `make test` starts one. Only CRUCIBLE_TESTS_WITHOUT_DOCKER=1
turns these tests into skips, for a developer who knows what they are leaving out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes import SandboxBackend, make_backend
from sandboxes.errors import BackendUnavailable


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
