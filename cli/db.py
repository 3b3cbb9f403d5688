"""`crucible db …`: migrations and the embedded Postgres.

Alembic is imported by the commands that migrate (`migrations.migrate`), not here: every `crucible …`
process imports this module, and Alembic alone is ~0.4 s of each one's start."""

from __future__ import annotations

import typer

from cli.console import console, readable_errors
from core.db import check_database, get_engine, resolve_database_url
from core.embedded import stop_embedded_postgres
from core.settings import get_settings

app = typer.Typer(help="Database: migrations and the embedded Postgres.", no_args_is_help=True)


@app.command()
def upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Apply migrations up to REVISION (default: head)."""
    from migrations import migrate

    with readable_errors():
        check_database(get_engine())
        migrate.upgrade(revision, url=resolve_database_url())
        console.print(f"database at revision [bold]{migrate.current()}[/]")


@app.command()
def downgrade(revision: str = typer.Argument(..., help="Target revision, e.g. -1 or base.")) -> None:
    """Revert migrations down to REVISION."""
    from migrations import migrate

    with readable_errors():
        check_database(get_engine())
        migrate.downgrade(revision, url=resolve_database_url())
        console.print(f"database at revision [bold]{migrate.current() or 'base'}[/]")


@app.command()
def current() -> None:
    """Print the database's current revision."""
    from migrations import migrate

    with readable_errors():
        console.print(migrate.current() or "base")


@app.command()
def url() -> None:
    """Print the database URL this process uses (starting the embedded one if needed)."""
    with readable_errors():
        console.print(resolve_database_url(), highlight=False, soft_wrap=True)


@app.command()
def stop() -> None:
    """Stop the embedded Postgres (no-op when a CRUCIBLE_DATABASE_URL is set)."""
    with readable_errors():
        settings = get_settings()
        if not settings.uses_embedded_database:
            console.print("CRUCIBLE_DATABASE_URL is set: there is no embedded Postgres to stop")
            return
        stopped = stop_embedded_postgres(settings.data_dir)
        console.print("stopped" if stopped else "not running")
