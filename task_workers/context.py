"""What a task-worker process holds for its whole life: one policy pool (a client per replica), one
Docker backend, one warm pool per sandbox spec, the event sink, the heartbeat and the reaper. Created
on first use (after Celery forks), closed at worker shutdown — which returns every sandbox (nothing is
left running).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from core.errors import ConfigError
from environments.images.registry import catalogued
from environments.sandboxes import DockerSandboxes
from sandboxes import Reaper, SandboxBackend, make_backend
from sandboxes.db_events import DbEventSink
from sandboxes.events import EventSink
from sandboxes.reaper import start_reaper
from task_workers.policy.client import PolicyClient, local_tokenizers
from task_workers.policy.pool import PolicyPool

logger = logging.getLogger(__name__)


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
                                        min_size=settings.sandbox_pool_min, max_size=settings.sandbox_pool_max,
                                        images=catalogued)  # an image this host never built: pulled by digest
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
