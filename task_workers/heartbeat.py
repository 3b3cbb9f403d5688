"""A worker's presence in the `workers` table, refreshed every few seconds by a daemon thread.

The controller reads `last_heartbeat_at` to tell a dead worker (stale: its episodes are
`worker_lost` and redispatched) from a slow one, and `incarnation` to tell this process from an
earlier one under the same name: each worker process has its own (`incarnation()`), written on the
worker's row when it starts and on every episode it leases. A worker that starts under a name whose
previous incarnation did not stop cleanly (killed, its machine gone) takes the row over, and the
controller requeues the previous incarnation's episodes on its next pass (controller/reconcile.py).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from core.db import session_scope
from core.models import Worker
from core.schemas.worker import ReplicaOut, ReplicasOut

logger = logging.getLogger(__name__)

_incarnations: dict[int, str] = {}
_announced: set[int] = set()


def incarnation() -> str:
    """This process's incarnation id: new in every process (a fork gets its own), fixed for its life."""
    pid = os.getpid()
    if pid not in _incarnations:
        _incarnations[pid] = uuid.uuid4().hex
    return _incarnations[pid]


def announced() -> str | None:
    """This process's incarnation once it beats under a worker name (what an episode it leases
    records), else None: an episode run outside a worker is judged by its deadline alone."""
    return incarnation() if os.getpid() in _announced else None


Published = Callable[[], dict[str, ReplicaOut]]
"""What a worker publishes with each beat: the policy replicas it holds out of rotation."""


def take_over(*, name: str, queues: list[str], control_url: str | None = None) -> str | None:
    """Announce this incarnation under `name`; the previous incarnation if it had not stopped cleanly
    (its leased episodes are then lost: the controller requeues them)."""
    mine = incarnation()
    with session_scope() as session:
        previous = session.execute(
            select(Worker.incarnation, Worker.stopped_at).where(Worker.name == name).with_for_update()
        ).one_or_none()
        _upsert(session, name=name, queues=queues, only_mine=False, control_url=control_url)
    _announced.add(os.getpid())
    if previous is None or previous.stopped_at is not None or previous.incarnation in (None, mine):
        return None
    logger.warning("worker %s: the previous process under this name (incarnation %s) did not stop cleanly; "
                   "the controller requeues the episodes it held", name, previous.incarnation)
    return str(previous.incarnation)


def beat(*, name: str, queues: list[str], replicas_out: dict[str, ReplicaOut] | None = None,
         control_url: str | None = None) -> bool:
    """Refresh this incarnation's heartbeat (and what it publishes); False (and nothing written) when
    another process has taken the name over since: this one's episodes are being requeued, and it
    should be stopped."""
    with session_scope() as session:
        return _upsert(session, name=name, queues=queues, only_mine=True, replicas_out=replicas_out,
                       control_url=control_url)


def _upsert(session: Session, *, name: str, queues: list[str], only_mine: bool,
            replicas_out: dict[str, ReplicaOut] | None = None, control_url: str | None = None) -> bool:
    now = datetime.now(UTC)
    mine = incarnation()
    values = {"last_heartbeat_at": now, "pid": os.getpid(), "hostname": socket.gethostname(), "queues": queues,
              "replicas_out": ReplicasOut.dump_python(replicas_out or {}, mode="json"), "control_url": control_url}
    statement = (
        insert(Worker).values(name=name, incarnation=mine, **values)
        .on_conflict_do_update(index_elements=[Worker.name], set_={**values, "stopped_at": None, "incarnation": mine},
                               where=(Worker.incarnation == mine) if only_mine else None)
        .returning(Worker.id)
    )
    return session.execute(statement).first() is not None


def mark_stopped(*, name: str) -> None:
    """A clean stop: this incarnation's row is marked stopped (not a successor's)."""
    with session_scope() as session:
        session.execute(update(Worker).where(Worker.name == name, Worker.incarnation == incarnation())
                        .values(stopped_at=datetime.now(UTC)))


class Heartbeat:
    def __init__(self, *, name: str, queues: list[str], interval_s: float = 5.0, published: Published | None = None,
                 control_url: str | None = None) -> None:
        """`control_url`: where this worker's sandbox control service answers (task_workers/control.py)."""
        self.name, self.queues, self.interval_s, self.published = name, queues, interval_s, published
        self.control_url = control_url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crucible-heartbeat", daemon=True)
        self._superseded = False

    def start(self) -> None:
        take_over(name=self.name, queues=self.queues, control_url=self.control_url)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 1)
        mark_stopped(name=self.name)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                kept = beat(name=self.name, queues=self.queues, control_url=self.control_url,
                            replicas_out=self.published() if self.published else None)
            except Exception:  # a missed beat is logged, never fatal: the next one may get through
                logger.exception("heartbeat failed")
                continue
            if not kept and not self._superseded:
                self._superseded = True
                logger.error("worker %s: another process has started under this name; the controller requeues "
                             "this one's episodes. Give every worker process its own CRUCIBLE_WORKER_NAME, "
                             "and stop this one.", self.name)
