"""A worker's presence in the `workers` table, refreshed every few seconds by a daemon thread.

The controller reads `last_heartbeat_at` to tell a dead worker (stale: its episodes are
`worker_lost` and redispatched) from a slow one.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import UTC, datetime

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert

from core.db import session_scope
from core.models import Worker

logger = logging.getLogger(__name__)


def beat(*, name: str, queues: list[str]) -> None:
    now = datetime.now(UTC)
    statement = insert(Worker).values(
        name=name, hostname=socket.gethostname(), pid=os.getpid(), queues=queues, last_heartbeat_at=now,
    )
    statement = statement.on_conflict_do_update(
        index_elements=[Worker.name],
        set_={"last_heartbeat_at": now, "pid": os.getpid(), "queues": queues, "stopped_at": None},
    )
    with session_scope() as session:
        session.execute(statement)


def mark_stopped(*, name: str) -> None:
    with session_scope() as session:
        session.execute(update(Worker).where(Worker.name == name).values(stopped_at=datetime.now(UTC)))


class Heartbeat:
    def __init__(self, *, name: str, queues: list[str], interval_s: float = 5.0) -> None:
        self.name, self.queues, self.interval_s = name, queues, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crucible-heartbeat", daemon=True)

    def start(self) -> None:
        beat(name=self.name, queues=self.queues)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 1)
        mark_stopped(name=self.name)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                beat(name=self.name, queues=self.queues)
            except Exception:  # a missed beat is logged, never fatal: the next one may get through
                logger.exception("heartbeat failed")
