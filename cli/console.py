"""The CLI's one rich console, output modes and the error boundary every command shares."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console

from core.errors import CrucibleError

console = Console()
err_console = Console(stderr=True)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


OutputOption = typer.Option(OutputFormat.table, "--output", "-o", help="table or json")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@contextmanager
def readable_errors() -> Iterator[None]:
    """Turn Crucible's own errors into one red line and exit code 2 — no traceback."""
    try:
        yield
    except CrucibleError as error:
        err_console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def run_safely(fn: Callable[[], Any]) -> Any:
    with readable_errors():
        return fn()
