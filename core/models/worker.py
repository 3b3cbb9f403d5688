"""Task workers announce themselves and beat a heartbeat, so the controller can tell a dead worker
(stale heartbeat: its episodes are `worker_lost` and redispatched) from a slow one.

A row per worker name; `incarnation` is the process beating under it now. A worker restarted under the
same name (compose's `restart: unless-stopped` keeps the hostname) gets a new incarnation, and the
episodes the previous one leased are lost at once, whatever their deadlines."""

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, DateTime, Integer, String, and_, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from core.models.base import Base, created_at_column


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    hostname: Mapped[str] = mapped_column(String(128))
    pid: Mapped[int] = mapped_column(Integer)
    incarnation: Mapped[str | None] = mapped_column(String(64))
    replicas_out: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    """Policy replicas this worker holds out of rotation, as of its last beat: name → {until (epoch s), error}."""
    queues: Mapped[list[Any]] = mapped_column(default=list)
    control_url: Mapped[str | None] = mapped_column(String(256))
    """Where the API reaches this worker's sandbox control service (task_workers/control.py), as of its last
    beat; None: it serves none."""
    started_at: Mapped[datetime] = created_at_column()
    last_heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


HEARTBEAT_TIMEOUT_S = 30.0
"""A worker whose last beat is older than this is dead (the controller's default heartbeat_timeout_s)."""


def alive(timeout_s: float = HEARTBEAT_TIMEOUT_S) -> ColumnElement[bool]:
    """The condition on a worker row that it is alive: not stopped, and beating within `timeout_s`."""
    return and_(Worker.stopped_at.is_(None), Worker.last_heartbeat_at >= func.now() - timedelta(seconds=timeout_s))
