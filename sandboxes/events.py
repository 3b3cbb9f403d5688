"""Lifecycle events and the EventSink seam they go through.

Every create, acquire, release, reset, retire, destroy, reap, oom, timeout and health failure is one
SandboxEventData with its duration. Sinks: `DbEventSink` (sandboxes.db_events, writes
`sandbox_events` rows), `InMemoryEventSink` (tests, benchmarks), `NullEventSink`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)


class EventKind(StrEnum):
    CREATE = "create"
    PULL = "pull"
    """The engine lacked the spec's image: it was pulled from its registry by digest (detail: image, reference)."""
    ACQUIRE = "acquire"
    RELEASE = "release"
    RESET = "reset"
    RETIRE = "retire"
    DESTROY = "destroy"
    REAP = "reap"
    OOM = "oom"
    TIMEOUT = "timeout"
    HEALTH_FAIL = "health_fail"
    EXEC = "exec"


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxEventData:
    """One lifecycle event; maps 1:1 onto a `sandbox_events` row."""

    sandbox_id: str
    kind: EventKind
    container_id: str | None = None
    worker: str | None = None
    run_id: int | None = None
    episode_id: int | None = None
    duration_ms: float | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)


@runtime_checkable
class EventSink(Protocol):
    """Where lifecycle events go. `record` must be cheap and must never raise into the caller."""

    def record(self, event: SandboxEventData) -> None: ...

    def close(self) -> None: ...


class NullEventSink:
    def record(self, event: SandboxEventData) -> None:
        pass

    def close(self) -> None:
        pass


class InMemoryEventSink:
    """Keeps every event in a list (thread-safe); for tests and the benchmark."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[SandboxEventData] = []

    def record(self, event: SandboxEventData) -> None:
        with self._lock:
            self._events.append(event)

    def close(self) -> None:
        pass

    @property
    def events(self) -> list[SandboxEventData]:
        with self._lock:
            return list(self._events)

    def kinds(self, sandbox_id: str | None = None) -> list[str]:
        return [e.kind.value for e in self.events if sandbox_id is None or e.sandbox_id == sandbox_id]

    def clear(self) -> None:
        with self._lock:
            self._events.clear()


class EventRecorder:
    """Binds a sink to one sandbox's identity so call sites only say what happened."""

    def __init__(self, *, sink: EventSink, sandbox_id: str, worker: str | None) -> None:
        self.sink = sink
        self.sandbox_id = sandbox_id
        self.worker = worker
        self.container_id: str | None = None
        self.run_id: int | None = None
        self.episode_id: int | None = None

    def emit(self, kind: EventKind, *, duration_s: float | None = None, **detail: Any) -> None:
        event = SandboxEventData(
            sandbox_id=self.sandbox_id,
            kind=kind,
            container_id=self.container_id,
            worker=self.worker,
            run_id=self.run_id,
            episode_id=self.episode_id,
            duration_ms=None if duration_s is None else round(duration_s * 1000.0, 3),
            detail={k: v for k, v in detail.items() if v is not None},
        )
        try:
            self.sink.record(event)
        except Exception:  # a broken sink must never break an episode
            log.exception("event sink %r failed on %s", self.sink, kind)

    @contextmanager
    def timed(self, kind: EventKind, **detail: Any) -> Iterator[dict[str, Any]]:
        """Emit `kind` with the block's duration; the block may add detail; failures add `error`."""
        extra: dict[str, Any] = {}
        start = time.perf_counter()
        try:
            yield extra
        except BaseException as error:
            extra.setdefault("error", f"{type(error).__name__}: {error}")
            raise
        finally:
            self.emit(kind, duration_s=time.perf_counter() - start, **detail, **extra)
