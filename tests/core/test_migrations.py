"""Migrations upgrade and downgrade cleanly on real Postgres, and match the models."""

from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool
from sqlalchemy.engine import make_url

from core.models import Base
from migrations import migrate
from migrations.migrate import include_object


@pytest.fixture
def scratch_url(database_url: str):
    """A second, empty database on the same server."""
    admin = make_url(database_url).set(drivername="postgresql")
    name = admin.database + "_scratch"
    dsn = admin.render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(scratch_url: str) -> None:
    migrate.upgrade("head", url=scratch_url)
    expected = {table.name for table in Base.metadata.sorted_tables}
    assert expected <= _tables(scratch_url)
    migrate.downgrade("base", url=scratch_url)
    assert _tables(scratch_url) == {"alembic_version"}
    migrate.upgrade("head", url=scratch_url)
    assert expected <= _tables(scratch_url)
    assert migrate.current(scratch_url) is not None


def test_models_and_migrations_agree(database_url: str) -> None:
    """Autogenerate against the migrated test database finds nothing to do."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "include_object": include_object}
            )
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_the_databases_termination_reasons_are_the_vocabularys(database_url: str) -> None:
    """The check constraint a migration wrote lists exactly core.termination.TerminationReason (autogenerate
    does not compare check constraints: a reason added to one and not the other is caught here)."""
    import re

    from core.termination import TerminationReason

    with psycopg.connect(make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)) as conn:
        definition = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                                  "WHERE conname = 'ck_episodes_reason_known'").fetchone()[0]
    assert re.findall(r"'([a-z_]+)'::", definition) == [reason.value for reason in TerminationReason], definition
