"""Long-running processes: `crucible api`, `crucible worker`."""

from __future__ import annotations

import typer

from cli.console import readable_errors
from core.settings import get_settings


def api(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8080, min=1, max=65535, help="Port to listen on."),
) -> None:
    """Serve the REST API and dashboard (bounded: see api.server and api.limits)."""
    with readable_errors():
        from api.production import check_ready_to_serve
        from core.db import check_database, get_engine, session_scope

        check_database(get_engine())
        with session_scope() as session:  # production without a live token: one line, not a traceback
            check_ready_to_serve(session, get_settings())
    from api.server import serve

    with readable_errors():
        serve(host=host, port=port)


def worker(
    queues: str = typer.Option("", "--queues", "-Q", help="Comma-separated queues; default: every environment kind."),
    concurrency: int = typer.Option(0, min=0, help="Threads; 0 = CRUCIBLE_WORKER_CONCURRENCY."),
) -> None:
    """Start a Celery task worker (threads pool: episodes are I/O-bound)."""
    from core.errors import ServiceUnavailable
    from core.health import check_broker, check_database
    from task_workers.celery_app import connect_worker_signals, get_app

    with readable_errors():
        database, database_url = check_database(get_settings())
        broker = check_broker(get_settings(), database_url) if database.ok else database
        if not broker.ok:  # one line, not Celery's banner and a hundred retries
            raise ServiceUnavailable(f"{broker.name}: {broker.detail} ({broker.fix})")
        app = get_app()
    from environments.registry import kind_names

    consumed = [q for q in queues.split(",") if q] or ["celery", *kind_names()]
    queues = ",".join(consumed)
    connect_worker_signals(queues=consumed)
    threads = concurrency or get_settings().worker_concurrency
    app.worker_main(
        ["worker", "--pool=threads", f"--concurrency={threads}", f"--queues={queues}", "--loglevel=INFO",
         f"--hostname={get_settings().worker_name}@%h"]
    )
