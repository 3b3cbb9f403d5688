"""Fixtures shared by every test: a real, freshly migrated Postgres database per test session.

The database server is the one in CRUCIBLE_TEST_DATABASE_URL (an admin URL; `make test` points it at
the machine's Postgres when one answers), else an embedded Postgres started under a temp dir.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from core import migrate
from core.db import make_engine, reset_engines
from core.models import Base
from core.settings import get_settings


def _admin_url(embedded_root: Path) -> str:
    configured = os.environ.get("CRUCIBLE_TEST_DATABASE_URL")
    if configured:
        return configured
    from core.embedded import ensure_embedded_postgres

    return ensure_embedded_postgres(embedded_root)


def _psycopg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A new database on the test server, migrated to head; dropped after the session."""
    # Not under pytest's basetemp: concurrent pytest sessions rotate those directories away.
    embedded_root = Path(tempfile.mkdtemp(prefix="crucible-test-pg-"))
    admin = make_url(_admin_url(embedded_root))
    name = f"crucible_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_psycopg_dsn(str(admin.render_as_string(hide_password=False))), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    migrate.upgrade("head", url=url)
    yield url
    reset_engines()
    with psycopg.connect(_psycopg_dsn(str(admin.render_as_string(hide_password=False))), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if (embedded_root / "postgres").exists():
        from core.embedded import stop_embedded_postgres

        stop_embedded_postgres(embedded_root)
    shutil.rmtree(embedded_root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def crucible_settings(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Point every Crucible component under test at the test database and a temp data dir."""
    os.environ["CRUCIBLE_DATABASE_URL"] = database_url
    os.environ.setdefault("CRUCIBLE_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def db_session(engine: Engine) -> Iterator[Session]:
    """A session on the test database; every table is emptied after the test."""
    with Session(engine, expire_on_commit=False) as session:
        yield session
    tables = ", ".join(f'"{table.name}"' for table in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
