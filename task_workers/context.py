"""What a task-worker process holds for its whole life: one policy pool (a client per replica), one
Docker backend, one warm pool per sandbox spec, the event sink, the heartbeat and the reaper. Created
on first use (after Celery forks), closed at worker shutdown — which returns every sandbox (nothing is
left running).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from core.errors import ConfigError
from environments.spec import EnvironmentSpec
from sandboxes import PoolSet, Reaper, SandboxBackend, SandboxSpec, make_backend
from sandboxes.db_events import DbEventSink
from sandboxes.errors import SandboxDead
from sandboxes.events import EventSink
from sandboxes.reaper import start_reaper
from task_workers.policy.client import PolicyClient, local_tokenizers
from task_workers.policy.pool import PolicyPool

logger = logging.getLogger(__name__)


def sandbox_spec_for(spec: EnvironmentSpec) -> SandboxSpec:
    """The sandbox an environment asks for; `image` names one of environments/images or any tag."""
    image = spec.image
    if ":" not in image and "/" not in image:
        from environments.images.build import image_tag

        image = image_tag(image)
    limits = {"command_timeout_s": spec.limits.tool_timeout_s, **spec.sandbox}
    return SandboxSpec.from_mapping({"image": image, **limits})


def package_sandboxes(sandboxes: DockerSandboxes, spec: EnvironmentSpec, *,
                      importing: bool = False) -> Callable[[str, list[str]], tuple[str, Any]]:
    """The task factory's maker of package images (factory.pipeline.PackageSandbox): each one `spec`'s image
    plus the package's requirements, its sandboxes fresh ones of `sandboxes` that no pool keeps. `importing`:
    the tasks go into `spec`'s environment, so its task_images must allow the image (checked before any is
    built, not after the factory's whole run)."""
    from environments.images.packages import REPOSITORY, package_image

    base = sandbox_spec_for(spec).image

    def make(package: str, requirements: list[str]) -> tuple[str, Any]:
        if importing and not spec.allows_task_image(f"{REPOSITORY}/{package.lower()}:0"):
            raise ConfigError(f"its tests need {', '.join(requirements)}, so its tasks run on an image of its own, "
                              f"and environment {spec.name!r} does not allow it: expected task_images to match "
                              f"{REPOSITORY}/*, got {spec.task_images}")
        tag = package_image(base, package, requirements)
        on = spec.on_image(tag)
        return tag, lambda: sandboxes.fresh(spec=on, run_id=None, episode_id=None)

    return make


class DockerSandboxes:
    """The episode runner's SandboxProvider over warm pools (one per distinct spec)."""

    def __init__(self, *, backend: SandboxBackend, events: EventSink, worker: str, min_size: int, max_size: int) -> None:
        self._pools = PoolSet(backend=backend, events=events, worker=worker, min_size=min_size, max_size=max_size)

    def pool_for(self, spec: EnvironmentSpec) -> Any:
        return self._pools.pool(sandbox_spec_for(spec))

    @contextmanager
    def lease(self, *, spec: EnvironmentSpec, run_id: int | None, episode_id: int | None) -> Iterator[Any]:
        if spec.task_image is not None:  # a task's own image: one sandbox, made for this episode, kept by no pool
            with self._pools.fresh(sandbox_spec_for(spec)) as sandbox:
                if not sandbox.assign(run_id=run_id, episode_id=episode_id):
                    raise SandboxDead(f"sandbox {sandbox.id} of {spec.image} died before its episode began")
                yield sandbox
            return
        with self.pool_for(spec).lease(run_id=run_id, episode_id=episode_id) as sandbox:
            yield sandbox

    @contextmanager
    def fresh(self, *, spec: EnvironmentSpec, run_id: int | None, episode_id: int | None) -> Iterator[Any]:
        if spec.task_image is not None:
            with self._pools.fresh(sandbox_spec_for(spec)) as sandbox:
                yield sandbox
            return
        with self.pool_for(spec).open_fresh() as sandbox:
            yield sandbox

    def close(self) -> None:
        self._pools.close()


@dataclass
class WorkerContext:
    policy: PolicyPool
    """The platform's pool (CRUCIBLE_POLICY_URLS)."""
    sandboxes: DockerSandboxes
    backend: SandboxBackend
    events: EventSink
    reaper: Reaper
    client_factory: Callable[[str], PolicyClient] | None = None
    _pools: dict[tuple[str, ...], PolicyPool] = field(default_factory=dict)
    _pools_lock: threading.Lock = field(default_factory=threading.Lock)

    def pool(self, urls: list[str]) -> PolicyPool:
        """The pool of a run that names its own servers (one per set of servers, made on first use)."""
        key = tuple(urls)
        with self._pools_lock:
            if key not in self._pools:
                if self.client_factory is None:
                    raise ConfigError("expected a policy client factory to reach a run's own servers, got none")
                self._pools[key] = PolicyPool(urls, client_factory=self.client_factory)
            return self._pools[key]

    def close(self) -> None:
        self.reaper.stop()
        self.sandboxes.close()
        self.policy.close()
        for pool in self._pools.values():
            pool.close()
        close = getattr(self.events, "close", None)
        if close:
            close()


_lock = threading.Lock()
_context: WorkerContext | None = None


def worker_context() -> WorkerContext:
    """This process's context, built on first use; the reaper sweeps once now and then on a schedule."""
    global _context
    with _lock:
        if _context is None:
            from core.settings import get_settings

            settings = get_settings()
            # The engine client's connection pool must exceed the episodes (and pool refills) in flight.
            backend = make_backend("docker", max_pool_size=max(32, 4 * settings.worker_concurrency))
            events = DbEventSink()
            reaper = start_reaper(backend=backend, events=events, worker=settings.worker_name)
            sandboxes = DockerSandboxes(backend=backend, events=events, worker=settings.worker_name,
                                        min_size=settings.sandbox_pool_min, max_size=settings.sandbox_pool_max)
            # Both of the tokenizer's functions: environment text tokenized with every special token split
            # (`split_special_tokens`), not only the chat family's listed control strings.
            tokenizer, plain = (local_tokenizers(str(settings.policy_tokenizer)) if settings.policy_tokenizer
                                else (None, None))
            def client(url: str) -> PolicyClient:
                return PolicyClient(base_url=url, tokenizer=tokenizer, plain_tokenizer=plain)

            policy = PolicyPool(settings.policy_pool, client_factory=client)
            _context = WorkerContext(policy, sandboxes, backend, events, reaper, client_factory=client)
        return _context


def close_worker_context() -> None:
    global _context
    with _lock:
        if _context is not None:
            _context.close()
            _context = None
