"""The Celery application every Crucible worker runs.

    crucible worker               # or: celery -A task_workers.celery_app worker

The broker is CRUCIBLE_BROKER_URL, else Celery's SQLAlchemy transport on Crucible's own database
(the embedded default needs no Redis). Results are not kept in a result backend: episodes write
their outcome to Postgres themselves.
"""

from __future__ import annotations

import os

from celery import Celery

from core.db import resolve_database_url
from core.health import broker_url_for
from core.settings import Settings, get_settings


def broker_url(settings: Settings | None = None) -> str:
    settings = settings or get_settings()
    if settings.broker_url is not None:
        return settings.broker_url
    return broker_url_for(settings, resolve_database_url(settings))


BROKER_TABLES_LOCK = 0x0C4B_0B01
"""Postgres advisory lock key under which the SQLAlchemy transport's tables are created."""


def prepare_sqlalchemy_broker(url: str) -> None:
    """Create the SQLAlchemy transport's tables before first use, one process at a time. kombu creates
    them on a channel's first connect with no lock, so a worker and the controller starting together on
    a new database race on `CREATE SEQUENCE queue_id_sequence` and one of them dies (UniqueViolation;
    seen when `make demo` starts both at once). Under a Postgres advisory lock one process creates them
    and the others find them (kombu's create_all checks first). Other brokers: nothing to do."""
    if not url.startswith("sqla+"):
        return
    from kombu import Connection
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url.removeprefix("sqla+"), poolclass=NullPool)
    try:
        with engine.connect() as lock:
            lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": BROKER_TABLES_LOCK})
            try:
                with Connection(url) as connection:
                    channel = connection.channel()
                    try:
                        channel._open()  # kombu's create_all, while we hold the lock
                    finally:
                        channel.close()
            finally:
                lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": BROKER_TABLES_LOCK})
    finally:
        engine.dispose()


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    url = broker_url(settings)
    prepare_sqlalchemy_broker(url)
    app = Celery("crucible")
    app.conf.update(
        broker_url=url,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # Episodes are long and must survive a worker crash: ack after the work is stored, fetch one at
        # a time, and hand an unacked task to another worker when this one dies.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        imports=["task_workers.tasks"],
    )
    return app


def _on_worker_ready(sender: object = None, **_: object) -> None:
    """Announce the worker and start its heartbeat; sandboxes and the reaper start on first episode."""
    from task_workers import heartbeat
    from task_workers.context import worker_context

    settings = get_settings()
    context = worker_context()  # the reaper sweeps what a crashed predecessor left, before any episode runs
    control_url = None
    if settings.worker_control_address != "off":
        from core.settings import control_address
        from task_workers.control import ControlServer, create_control_app

        host, port = control_address(settings.worker_control_address)
        server = ControlServer(create_control_app(context.backend, worker=settings.worker_name), host=host, port=port)
        control_url = server.start()
        _state["control"] = server
    beat = heartbeat.Heartbeat(name=settings.worker_name, queues=list(_state.get("queues", [])),  # type: ignore[call-overload]
                               published=context.policy.out_of_rotation, control_url=control_url)
    beat.start()
    _state["heartbeat"] = beat


def _on_worker_shutdown(**_: object) -> None:
    """Graceful shutdown: return every sandbox, mark the worker stopped."""
    from task_workers.context import close_worker_context

    close_worker_context()
    control = _state.pop("control", None)
    if control is not None:
        control.stop()  # type: ignore[attr-defined]
    beat = _state.pop("heartbeat", None)
    if beat is not None:
        beat.stop()  # type: ignore[attr-defined]


_state: dict[str, object] = {}


def connect_worker_signals(*, queues: list[str]) -> None:
    """Called by `crucible worker` before it starts consuming `queues`."""
    from celery import signals

    _state["queues"] = queues
    signals.worker_ready.connect(_on_worker_ready, weak=False)
    signals.worker_shutdown.connect(_on_worker_shutdown, weak=False)


class _LazyApp:
    """`app` is built on first use, so importing this module reads no settings and opens no database."""

    _app: Celery | None = None
    _pid: int | None = None

    def get(self) -> Celery:
        if self._app is None or self._pid != os.getpid():
            self._app, self._pid = create_app(), os.getpid()
        return self._app


_lazy = _LazyApp()


def get_app() -> Celery:
    return _lazy.get()
