"""Celery round trips through both brokers Crucible supports: its SQLAlchemy transport on Postgres
(the embedded default) and Redis (production)."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from celery.contrib.testing.worker import start_worker

from core.settings import load_settings
from task_workers.celery_app import create_app


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

    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING"):
        record.delay(41 + 1)
        assert done.wait(60), "the worker never ran the task"
    assert seen == [42]


def test_sqlalchemy_transport_on_postgres() -> None:
    _round_trip(None)


def test_redis_broker() -> None:
    url = os.environ.get("CRUCIBLE_TEST_REDIS_URL")
    if not url:
        pytest.skip("CRUCIBLE_TEST_REDIS_URL is unset (make test sets it)")
    _round_trip(url)
