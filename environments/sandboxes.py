"""Sandboxes for environments: an environment spec's sandbox (`sandbox_spec_for`), and `DockerSandboxes`,
warm pools of them (one per distinct sandbox spec) with fresh sandboxes of a task's own image. A task
worker holds one (task_workers.context); so do the CLI, the recipes, the benches and the OpenEnv server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from core.errors import ConfigError
from environments.spec import EnvironmentSpec
from sandboxes import PoolSet, Sandbox, SandboxBackend, SandboxPool, SandboxSpec
from sandboxes.backend import ImageSource
from sandboxes.errors import SandboxDead
from sandboxes.events import EventSink


def sandbox_spec_for(spec: EnvironmentSpec) -> SandboxSpec:
    """The sandbox an environment asks for; `image` names one of environments/images or any tag."""
    image = spec.image
    if ":" not in image and "/" not in image:
        from environments.images.build import image_tag

        image = image_tag(image)
    limits = {"command_timeout_s": spec.limits.tool_timeout_s, **spec.sandbox}
    return SandboxSpec.from_mapping({"image": image, **limits})


def package_sandboxes(sandboxes: DockerSandboxes, spec: EnvironmentSpec, *,
                      importing: bool = False) -> Callable[[str, list[str]], tuple[str, Callable[[], AbstractContextManager[Sandbox]]]]:
    """The task factory's maker of package images (factory.pipeline.PackageSandbox): each one `spec`'s image
    plus the package's requirements, its sandboxes fresh ones of `sandboxes` that no pool keeps. `importing`:
    the tasks go into `spec`'s environment, so its task_images must allow the image (checked before any is
    built, not after the factory's whole run)."""
    from environments.images.packages import REPOSITORY, package_image

    base = sandbox_spec_for(spec).image

    def make(package: str, requirements: list[str]) -> tuple[str, Callable[[], AbstractContextManager[Sandbox]]]:
        if importing and not spec.allows_task_image(f"{REPOSITORY}/{package.lower()}:0"):
            raise ConfigError(f"its tests need {', '.join(requirements)}, so its tasks run on an image of its own, "
                              f"and environment {spec.name!r} does not allow it: expected task_images to match "
                              f"{REPOSITORY}/*, got {spec.task_images}")
        tag = package_image(base, package, requirements)
        on = spec.on_image(tag)
        return tag, lambda: sandboxes.fresh(spec=on, run_id=None, episode_id=None)

    return make


class DockerSandboxes:
    """Sandboxes for environments: warm pools (one per distinct sandbox spec) and fresh sandboxes of a task's
    own image; the episode runner's SandboxProvider, and what the CLI, recipes, benches and the OpenEnv
    server lease sandboxes from."""

    def __init__(self, *, backend: SandboxBackend, events: EventSink, worker: str, min_size: int, max_size: int,
                 images: ImageSource | None = None) -> None:
        """`images`: where an image this host lacks is pulled from by digest (environments.images.registry
        .catalogued, on a worker host); None: nowhere."""
        self._pools = PoolSet(backend=backend, events=events, worker=worker, min_size=min_size, max_size=max_size,
                              images=images)

    def pool_for(self, spec: EnvironmentSpec) -> SandboxPool:
        return self._pools.pool(sandbox_spec_for(spec))

    @contextmanager
    def lease(self, *, spec: EnvironmentSpec, run_id: int | None, episode_id: int | None) -> Iterator[Sandbox]:
        if spec.task_image is not None:  # a task's own image: one sandbox, made for this episode, kept by no pool
            with self._pools.fresh(sandbox_spec_for(spec)) as sandbox:
                if not sandbox.assign(run_id=run_id, episode_id=episode_id):
                    raise SandboxDead(f"sandbox {sandbox.id} of {spec.image} died before its episode began")
                yield sandbox
            return
        with self.pool_for(spec).lease(run_id=run_id, episode_id=episode_id) as sandbox:
            yield sandbox

    @contextmanager
    def fresh(self, *, spec: EnvironmentSpec, run_id: int | None, episode_id: int | None) -> Iterator[Sandbox]:
        if spec.task_image is not None:
            with self._pools.fresh(sandbox_spec_for(spec)) as sandbox:
                yield sandbox
            return
        with self.pool_for(spec).open_fresh() as sandbox:
            yield sandbox

    def close(self) -> None:
        self._pools.close()
