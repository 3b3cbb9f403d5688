"""The `crucible` command line: `crucible --help` lists everything."""

from __future__ import annotations

import logging

import typer

from cli import db, environments, episodes, evals, services, tokens
from cli import open as open_
from cli.console import CrucibleGroup, readable_errors, set_debug
from cli.controller import controller, runs_app
from cli.cost import cost
from cli.doctor import doctor
from cli.follow import follow
from cli.images import app as images_app
from cli.model import app as model_app
from cli.model import serve
from cli.rm import app as rm_app
from cli.sandbox import app as sandbox_app
from cli.trainer import trainer
from core import redact
from core.settings import get_settings

app = typer.Typer(
    name="crucible", help="Train LLM agents with RL in real sandboxes.", no_args_is_help=True,
    pretty_exceptions_enable=False, cls=CrucibleGroup,
)
app.add_typer(db.app, name="db")
app.add_typer(environments.env_app, name="env")
app.add_typer(environments.tasks_app, name="tasks")
app.add_typer(model_app, name="model")
app.add_typer(rm_app, name="rm")
app.command()(serve)
app.command()(controller)
app.command()(trainer)
app.add_typer(runs_app, name="run")
app.add_typer(runs_app, name="runs", hidden=True)  # `crucible runs archive 42` reads as well
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(images_app, name="images")
app.add_typer(episodes.app, name="episodes")
app.add_typer(evals.app, name="eval")
app.add_typer(tokens.app, name="token")
app.command("open")(open_.open_)
runs_app.command("follow")(follow)
runs_app.command("cost")(cost)
app.command()(doctor)
app.command()(services.api)
app.command()(services.worker)


@app.callback()
def _configure(
    debug: bool = typer.Option(False, "--debug", help="On failure, print the traceback, not one line."),
) -> None:
    set_debug(debug)
    with readable_errors():
        settings = get_settings()  # fail fast on bad settings, before any command runs
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Alembic ≥ 1.16 logs an INFO line per built-in plugin as it is imported (by the migrating commands):
    # noise ahead of their answer or one-line error.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    redact.install(redact.settings_secrets())  # before any command logs: no credential in any line


@app.command()
def version() -> None:
    """Print Crucible's version."""
    from importlib.metadata import version as package_version

    typer.echo(package_version("crucible"))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
