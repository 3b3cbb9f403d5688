"""Leader election: one controller dispatches; the others wait to take over.

The leader holds a Postgres session-level advisory lock on a connection of its own for as long as it
lives. When that connection closes (the process dies, the network drops), Postgres releases the lock
and the next controller to try gets it. All scheduling state is in the database, so the new leader
carries on where the old one stopped.
"""

from __future__ import annotations

import contextlib
import zlib

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from controller.logs import log_event

LOCK_KEY = zlib.crc32(b"crucible.controller.leader")
"""The advisory lock key every controller of a database competes for."""

_HOLDS_LOCK = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
    "AND granted AND classid = :classid AND objid = :objid AND objsubid = 1"
)


class LeaderLock:
    """`acquire()` each pass: True while this process leads. Not thread-safe; one per controller."""

    def __init__(self, engine: Engine, *, key: int = LOCK_KEY, name: str = "controller") -> None:
        self.engine, self.key, self.name = engine, key, name
        self._conn: Connection | None = None
        self._held = False

    @property
    def held(self) -> bool:
        return self._held

    @property
    def backend_pid(self) -> int | None:
        """The Postgres backend holding (or trying for) the lock: tests terminate it to simulate a crash."""
        if self._conn is None:
            return None
        return int(self._conn.execute(text("SELECT pg_backend_pid()")).scalar_one())

    def acquire(self) -> bool:
        """Try to become (or confirm being) the leader. Never blocks on another holder."""
        try:
            conn = self._connection()
            if self._held:
                still = conn.execute(_HOLDS_LOCK, {"classid": self.key >> 32, "objid": self.key & 0xFFFFFFFF})
                self._held = bool(still.scalar_one())
            else:
                got = conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": self.key}).scalar_one()
                self._held = bool(got)
                if self._held:
                    log_event("leader.acquired", controller=self.name)
        except DBAPIError as error:  # the connection died: whatever we held is gone with it
            self._drop(reason=str(error.orig or error).strip().splitlines()[0])
        return self._held

    def release(self) -> None:
        """Give up leadership and close the dedicated connection."""
        if self._conn is not None and self._held:
            with contextlib.suppress(DBAPIError):  # a dead connection has released it already
                self._conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
        self._drop(reason="released")

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self._conn

    def _drop(self, *, reason: str) -> None:
        if self._held:
            log_event("leader.lost", controller=self.name, reason=reason)
        self._held = False
        if self._conn is not None:
            # Invalidate rather than return to the pool: the session (and any lock) must end.
            self._conn.invalidate()
            self._conn.close()
            self._conn = None
