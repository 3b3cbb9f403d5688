"""(issue 50) Sandbox images through a real registry (Debian's `docker-registry`, the distribution v2
server, on loopback): `crucible images push` records each image's digest; an engine that lacks the image
pulls it by that digest when a sandbox of it is first made — a `pull` sandbox event — and runs it; an
image nobody pushed is refused naming the command that fixes it; a hostile registry or image name is one
line naming what was expected."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.main import app
from environments.images.registry import catalogued, push_images, registry_of
from sandboxes import InMemoryEventSink, SandboxBackend, SandboxPool, SandboxSpec
from sandboxes.docker_client import docker_api
from sandboxes.errors import ImageNotFound
from tests.support.registry import serve_registry, tiny_image

pytestmark = [pytest.mark.docker,
              pytest.mark.skipif(shutil.which("docker-registry") is None,
                                 reason="needs Debian's docker-registry (scripts/setup.sh installs it)")]
REPOSITORY = "crucible-test/pulled"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A registry on a loopback port (the engine trusts 127.0.0.0/8 without TLS), its storage in tmp_path."""
    with serve_registry(tmp_path / "data") as address:
        yield address


@pytest.fixture
def pushable(base_spec: SandboxSpec) -> Iterator[str]:
    """A name of the base image of this test's own (removing it later leaves every other name alone)."""
    api = docker_api()
    tag = secrets.token_hex(6)
    api.tag(base_spec.image, REPOSITORY, tag)
    yield f"{REPOSITORY}:{tag}"
    for image in api.images(name=REPOSITORY):
        for name in image.get("RepoTags") or []:
            if name.startswith(f"{REPOSITORY}:{tag}"):
                api.remove_image(name, noprune=True)


@pytest.fixture
def tiny() -> Iterator[str]:
    with tiny_image(f"{REPOSITORY}-tiny") as image:
        yield image


def test_a_pushed_image_is_catalogued_and_an_engine_that_lacks_it_pulls_it_by_digest(
        db_session: Session, backend: SandboxBackend, registry: str, tiny: str) -> None:
    api = docker_api()
    [pushed] = push_images([tiny], registry=registry)
    assert pushed.image == tiny and pushed.reference.startswith(f"{registry}/{REPOSITORY}-tiny@sha256:")
    assert catalogued(tiny) == pushed.reference
    digest = pushed.reference.rpartition("@")[2]  # a host that reaches the registry by another name pulls from it
    assert catalogued(tiny, registry="10.77.0.1:5000") == f"10.77.0.1:5000/{REPOSITORY}-tiny@{digest}"
    assert push_images([tiny], registry=registry) == [pushed]  # idempotent: the same bytes, the same digest
    assert not api.images(name=f"{registry}/{REPOSITORY}-tiny")  # the registry's name was only lent for the push
    api.remove_image(tiny, noprune=True)
    assert not api.images(name=tiny)
    backend.pull_image(pushed.reference, as_image=tiny)  # what sandboxes.create does on a missing image
    assert pushed.reference in api.inspect_image(tiny)["RepoDigests"]  # the very bytes that were pushed
    with pytest.raises(ImageNotFound, match="in its registry"):
        backend.pull_image(f"{registry}/{REPOSITORY}-tiny@sha256:{'0' * 64}", as_image=tiny)


def test_an_image_nobody_pushed_is_refused_naming_the_command(
        db_session: Session, backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    never = f"{REPOSITORY}:never-{secrets.token_hex(4)}"
    with SandboxPool(spec=base_spec.model_copy(update={"image": never}), backend=backend, min_size=0, max_size=1,
                     images=catalogued) as pool, pytest.raises(ImageNotFound, match="crucible images push"):
        pool.acquire()


@pytest.mark.slow
def test_a_sandbox_runs_on_an_image_its_engine_pulled_from_the_registry(
        db_session: Session, backend: SandboxBackend, base_spec: SandboxSpec, registry: str, pushable: str) -> None:
    """The whole path on the real base image (its push takes ~20 s here: `make test-all`)."""
    [pushed] = push_images([pushable], registry=registry)
    docker_api().remove_image(pushable, noprune=True)  # this engine no longer has it under the spec's name
    events = InMemoryEventSink()
    spec = base_spec.model_copy(update={"image": pushable})
    pool = SandboxPool(spec=spec, backend=backend, events=events, min_size=0, max_size=1, images=catalogued)
    with pool, pool.lease() as sandbox:
        assert sandbox.step("echo pulled-and-ran").stdout == "pulled-and-ran\n"
    [pull] = [event for event in events.events if event.kind.value == "pull"]
    assert pull.detail["reference"] == pushed.reference and pull.detail["image"] == pushable


@pytest.mark.parametrize("registry, expected", [
    ("http://10.0.0.1:5000", "expected a registry address host:port[/path]"),
    ("10.0.0.1:5000/../etc", "expected a registry address"),
    ("registry", "expected a registry address"),  # Docker would read it as a repository on Docker Hub
    ("a b:5000", "expected a registry address"),
    ("x" * 5000, "expected a registry address"),
])
def test_a_registry_that_is_not_an_address_is_refused_at_the_edge(registry: str, expected: str) -> None:
    result = CliRunner().invoke(app, ["images", "push", "crucible/base:x", "--registry", registry])
    assert result.exit_code == 2 and expected in result.output and len(result.output.splitlines()) <= 3, result.output


def test_pushing_an_image_this_host_lacks_names_it(db_session: Session, registry: str) -> None:
    result = CliRunner().invoke(app, ["images", "push", f"{REPOSITORY}:absent", "--registry", registry])
    assert result.exit_code == 2 and f"expected '{REPOSITORY}:absent' on this host's Docker engine" in result.output
    result = CliRunner().invoke(app, ["images", "push", "no-tag-at-all/", "--registry", registry])
    assert result.exit_code == 2 and "expected repository:tag" in result.output
    assert registry_of(registry) == registry
