"""`crucible doctor`: is everything Crucible needs here, and if not, how to fix it."""

from __future__ import annotations

import typer
from rich.table import Table

from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors
from core.health import run_checks
from core.settings import get_settings


def doctor(output: OutputFormat = OutputOption) -> None:
    """Check the Docker engine, database, broker, policy server and disk."""
    with readable_errors():
        results = run_checks(get_settings())
    if output is OutputFormat.json:
        print_json([result.__dict__ for result in results])
    else:
        table = Table(title="crucible doctor")
        for column in ("check", "status", "detail", "fix"):
            table.add_column(column, overflow="fold")
        for result in results:
            status = "[green]ok[/]" if result.ok else ("[red]FAIL[/]" if result.required else "[yellow]warn[/]")
            table.add_row(result.name, status, result.detail, result.fix)
        console.print(table)
    if any(result.required and not result.ok for result in results):
        raise typer.Exit(1)
