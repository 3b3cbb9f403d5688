"""Images without a registry: content-hash tags, so an unchanged image is never rebuilt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from environments.images import build_images, image_tag
from environments.images.build import base_hash, build_environment, context_hash
from sandboxes import SandboxBackend
from sandboxes.docker_client import docker_api

pytestmark = pytest.mark.docker


def test_second_build_is_a_no_op(sandbox_images: dict[str, str], image_cache: Path) -> None:
    again = build_images(data_dir=image_cache)
    assert {b.name: b.tag for b in again} == sandbox_images
    assert not any(b.built for b in again)
    assert sandbox_images["base"] == image_tag("base") == f"crucible/base:{base_hash()}"
    assert sandbox_images["code-repo"] == image_tag("code-repo")


def test_base_image_has_the_agent_user_and_tools(backend: SandboxBackend, sandbox_images: dict[str, str]) -> None:
    api = docker_api()
    config = api.inspect_image(sandbox_images["code-repo"])["Config"]
    assert "LANG=C.UTF-8" in config["Env"]
    assert api.inspect_image(sandbox_images["base"])["Id"] != api.inspect_image(sandbox_images["code-repo"])["Id"]
    tools = ("python3", "git", "ps", "bash", "patch")
    script = ("id -u agent; id -g agent; stat -c %U /workspace; test -d /home/agent && echo home; "
              f"for tool in {' '.join(tools)}; do command -v $tool || echo missing:$tool; done")
    for image in (sandbox_images["base"], sandbox_images["code-repo"]):
        out = docker.from_env().containers.run(image, ["bash", "-c", script], network_mode="none",
                                               remove=True).decode().split()
        assert out[:4] == ["1000", "1000", "agent", "home"], (image, out)
        assert [Path(found).name for found in out[4:]] == list(tools), (image, out)


@pytest.fixture
def tiny_images(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "images"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY hello.txt /opt/hello.txt\n")
    (root / "tiny" / "hello.txt").write_text("one\n")
    yield root
    api = docker_api()
    for image in api.images(name="crucible/tiny"):
        for tag in image.get("RepoTags") or []:
            api.remove_image(tag, force=True)


def test_environment_image_rebuilds_only_when_inputs_change(sandbox_images: dict[str, str], tiny_images: Path) -> None:
    api, base = docker_api(), sandbox_images["base"]
    first = build_environment("tiny", api=api, base_tag=base, images_dir=tiny_images)
    second = build_environment("tiny", api=api, base_tag=base, images_dir=tiny_images)
    assert first.built and not second.built and first.tag == second.tag
    assert first.tag == f"crucible/tiny:{context_hash(tiny_images / 'tiny', base_tag=base)}"

    (tiny_images / "tiny" / "hello.txt").write_text("two\n")
    third = build_environment("tiny", api=api, base_tag=base, images_dir=tiny_images)
    assert third.built and third.tag != first.tag
    assert context_hash(tiny_images / "tiny", base_tag="crucible/base:other") != third.tag.split(":")[1]
