"""A throwaway database for a benchmark: created on the configured server (or an embedded one),
migrated, set as CRUCIBLE_DATABASE_URL for this process, dropped at the end (also on Ctrl-C or SIGTERM)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from cli.console import sigterm_interrupts
from core.db import reset_engines
from core.settings import get_settings
from migrations import migrate


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    admin_url = os.environ.get("CRUCIBLE_BENCH_DATABASE_URL") or os.environ.get("CRUCIBLE_TEST_DATABASE_URL")
    embedded: Path | None = None
    if not admin_url:
        from core.embedded import ensure_embedded_postgres

        embedded = Path(tempfile.mkdtemp(prefix="crucible-bench-pg-"))
        admin_url = ensure_embedded_postgres(embedded)
    admin = make_url(admin_url)
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    migrate.upgrade("head", url=url)
    previous = os.environ.get("CRUCIBLE_DATABASE_URL")
    os.environ["CRUCIBLE_DATABASE_URL"] = url
    get_settings.cache_clear()
    # SIGTERM (`kill`, a CI timeout) cleans up as Ctrl-C does; by default it would end the process past
    # this `finally`, leaving the database and the embedded server behind.
    try:
        with sigterm_interrupts():
            yield url
    finally:
        reset_engines()
        if previous is None:
            os.environ.pop("CRUCIBLE_DATABASE_URL", None)
        else:
            os.environ["CRUCIBLE_DATABASE_URL"] = previous
        get_settings.cache_clear()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if embedded is not None:  # the server this benchmark started for itself: nothing left running
            from core.embedded import stop_embedded_postgres

            stop_embedded_postgres(embedded)
            shutil.rmtree(embedded, ignore_errors=True)
