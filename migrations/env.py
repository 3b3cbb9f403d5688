"""Alembic environment: the URL comes from Crucible's settings (embedded Postgres if unset)."""

from alembic import context
from sqlalchemy import create_engine, pool

from core.db import resolve_database_url
from core.models import Base
from migrations.migrate import include_object

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or resolve_database_url()
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, compare_type=True, include_object=include_object
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url") or resolve_database_url()
    engine = create_engine(url, poolclass=pool.NullPool)  # migrations need no pool
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, compare_type=True, include_object=include_object
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
