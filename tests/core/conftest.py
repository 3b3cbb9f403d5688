"""Fixtures of the core tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url


@pytest.fixture
def empty_url(database_url: str) -> Iterator[str]:
    """A new, empty database on the test server (no migrations), dropped after the test."""
    admin = make_url(database_url).set(drivername="postgresql")
    name = f"{admin.database}_e_{uuid.uuid4().hex[:6]}"
    dsn = admin.render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
