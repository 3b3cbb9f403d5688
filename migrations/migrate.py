"""Apply Alembic migrations programmatically (`crucible db upgrade` / `downgrade`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

SCRIPT_LOCATION = Path(__file__).resolve().parent


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    """Ignore tables that are not ours (Celery's SQLAlchemy transport keeps kombu_* tables here)."""
    return not (type_ == "table" and reflected and compare_to is None)


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    if url:
        # ConfigParser interpolation: a literal % in a password must be doubled.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(revision: str = "head", *, url: str | None = None) -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(revision: str, *, url: str | None = None) -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str | None = None) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    from core.db import resolve_database_url

    engine = create_engine(url or resolve_database_url())
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
