"""Celery round trips through both brokers Crucible supports: its SQLAlchemy transport on Postgres
(the embedded default) and Redis (production)."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from core.settings import load_settings
from task_workers.celery_app import create_app
from tests.support.celery_worker import embedded_worker


def _round_trip(broker_url: str | None) -> None:
    settings = load_settings(broker_url=broker_url)
    app = create_app(settings)
    app.conf.imports = []
    done = threading.Event()
    seen: list[int] = []

    @app.task(name=f"tests.record.{uuid.uuid4().hex}", shared=False)
    def record(value: int) -> None:
        seen.append(value)
        done.set()

    with embedded_worker(app):
        record.delay(41 + 1)
        assert done.wait(60), "the worker never ran the task"
    assert seen == [42]


def test_sqlalchemy_transport_on_postgres() -> None:
    _round_trip(None)


def test_a_worker_starts_after_an_earlier_one_was_slow_to_stop() -> None:
    """An earlier worker of this process that outlived its stop leaves celery's should_terminate at 0
    (CI, stop 38): a plain start_worker then never became ready and the test hung for 600 s. The
    embedded worker starts and runs a task all the same."""
    from celery.worker import state

    state.should_terminate = 0
    _round_trip(None)
    assert state.should_terminate is None


def test_redis_broker() -> None:
    url = os.environ.get("CRUCIBLE_TEST_REDIS_URL")
    if not url:
        pytest.skip("CRUCIBLE_TEST_REDIS_URL is unset (make test sets it)")
    _round_trip(url)


def test_processes_starting_together_on_a_new_database_all_get_the_broker_tables(database_url: str,
                                                                                 tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kombu creates the SQLAlchemy transport's tables on first connect with no lock: a worker and the
    controller starting at once on a new database raced on CREATE SEQUENCE and one died (seen in `make
    demo`). Six processes released at the same instant on an empty database all start; the tables exist."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psycopg
    from sqlalchemy import make_url

    admin = make_url(database_url)
    name = f"broker_race_{uuid.uuid4().hex[:8]}"
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = "sqla+" + admin.set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    go = tmp_path / "go"
    script = ("import os, sys, time\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
              "from task_workers.celery_app import prepare_sqlalchemy_broker\n"
              "prepare_sqlalchemy_broker(sys.argv[1])\n")
    root = Path(__file__).resolve().parents[2]
    try:
        children = [subprocess.Popen([sys.executable, "-c", script, url], cwd=root, stderr=subprocess.PIPE)
                    for _ in range(6)]
        time.sleep(3)  # every child imported and waiting
        go.touch()
        results = [(child.wait(120), child.stderr.read().decode()[-800:]) for child in children]  # type: ignore[union-attr]
        assert all(code == 0 for code, _ in results), results
        with psycopg.connect(admin.set(drivername="postgresql", database=name).render_as_string(hide_password=False)) as conn:
            tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert {"kombu_queue", "kombu_message"} <= tables
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
