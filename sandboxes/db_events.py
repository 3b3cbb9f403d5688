"""DbEventSink: lifecycle events as `sandbox_events` rows, written in batches.

`record` only appends to a buffer (no database round trip on an episode's path); a daemon thread
writes a batch when `batch_size` events are waiting or `flush_interval_s` has passed, and `flush()` /
`close()` write everything left. A database outage is logged and the events are kept for the next
try, the oldest dropped beyond `max_buffer`: sandbox telemetry never stops an episode.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from sandboxes.events import SandboxEventData

log = logging.getLogger(__name__)

SessionScope = Callable[[], AbstractContextManager[Session]]


def _default_scope() -> AbstractContextManager[Session]:
    from core.db import session_scope

    return session_scope()


class DbEventSink:
    """An EventSink that writes SandboxEvent rows through `session_scope` (commits on exit)."""

    def __init__(
        self,
        *,
        session_scope: SessionScope = _default_scope,
        batch_size: int = 64,
        flush_interval_s: float = 2.0,
        max_buffer: int = 10_000,
    ) -> None:
        self._scope = session_scope
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._max_buffer = max_buffer
        self._lock = threading.Lock()  # guards the buffer
        self._write_lock = threading.Lock()  # one writer at a time keeps rows in order
        self._buffer: list[SandboxEventData] = []
        self._closed = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, event: SandboxEventData) -> None:
        with self._lock:
            self._buffer.append(event)
            if len(self._buffer) > self._max_buffer:
                del self._buffer[: len(self._buffer) - self._max_buffer]
            full = len(self._buffer) >= self._batch_size
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="sandbox-events", daemon=True)
                self._thread.start()
        if self._closed:
            self.flush()
        elif full:
            self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            self.flush()

    def flush(self) -> int:
        """Write everything buffered; returns the number of rows written (0 on a database error)."""
        with self._write_lock:
            with self._lock:
                batch, self._buffer = self._buffer, []
            if not batch:
                return 0
            try:
                self._write(batch)
            except Exception:
                log.exception("could not write %d sandbox events; keeping them for the next flush", len(batch))
                with self._lock:
                    self._buffer[:0] = batch
                return 0
            return len(batch)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()

    def _write(self, batch: list[SandboxEventData]) -> None:
        from core.models import SandboxEvent

        with self._scope() as session:
            session.add_all(
                SandboxEvent(
                    sandbox_id=e.sandbox_id,
                    container_id=e.container_id,
                    kind=e.kind.value,
                    worker=e.worker,
                    run_id=e.run_id,
                    episode_id=e.episode_id,
                    duration_ms=e.duration_ms,
                    detail=dict(e.detail),
                    created_at=datetime.fromtimestamp(e.at, tz=UTC),
                )
                for e in batch
            )
