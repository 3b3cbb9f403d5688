"""A real Celery worker on a thread of the test process, stopped so that the next one can start.

Celery's `start_worker` stops its thread by setting the process-wide `celery.worker.state.should_terminate`
to 0 and puts it back to None only if the thread exits within `shutdown_timeout` (10 s by default). On
a loaded 2-core machine one worker finishing an episode's clean-up took longer (CI, stop 38): the flag
stayed 0, and every later worker in that xdist process stopped as it started, so the next two tests
waited on `ensure_started` until pytest-timeout killed them at 600 s each. Here the stop has two minutes
and the flag is put back whatever happens.

    with embedded_worker(app, queues=["code_repo"]):
        app.send_task(...)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.worker import state

SHUTDOWN_TIMEOUT_S = 120.0


@contextmanager
def embedded_worker(app: Celery, *, queues: list[str] | None = None) -> Iterator[object]:
    """One worker thread (threads pool, one slot) consuming `queues` (the app's default queue if None)."""
    state.should_terminate = None  # whatever an earlier worker of this process left
    state.should_stop = None
    options = {"queues": queues} if queues is not None else {}
    try:
        with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING",
                          shutdown_timeout=SHUTDOWN_TIMEOUT_S, **options) as worker:
            yield worker
    finally:
        state.should_terminate = None
        state.should_stop = None
