"""The CLI's one rich console, output modes and the error boundary every command shares.

    with readable_errors(): ...       # Crucible's own errors: one red line, exit 2
    CrucibleGroup                     # every other failure: one red line, exit 1 (`--debug`: the traceback)
    safe(text) / safe_text(text)      # stored text (model or tool output) made harmless for a terminal

Text from the store was written by a model, a tool or a stranger: printed raw, an escape sequence in
it can retitle the terminal, hide lines or rewrite what was shown, and `[...]` would be read as rich
markup. Everything stored goes through `safe` before it is printed.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from types import FrameType
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from typer.core import TyperGroup
from typer.exceptions import TyperException

from core.errors import CrucibleError

console = Console()
err_console = Console(stderr=True)
_state = {"debug": False}

# C0 controls but newline and tab, DEL, C1 controls (U+009B is a one-character CSI), and the
# bidirectional overrides that reorder what a reader sees ("trojan source").
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


OutputOption = typer.Option(OutputFormat.table, "--output", "-o", help="table or json")


def set_debug(enabled: bool) -> None:
    _state["debug"] = enabled


def debug_enabled() -> bool:
    return _state["debug"]


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(value: object) -> str:
    """`value` as text with every terminal control character written out (`\\x1b`), newlines kept."""
    return _UNSAFE.sub(_visible, str(value))


def safe(value: object) -> str:
    """For an f-string given to `console.print`: controls escaped, rich markup neutralised."""
    return escape(escape_controls(value))


def safe_text(value: object, *, style: str = "") -> Text:
    """A rich Text (never parsed as markup) with controls escaped."""
    return Text(escape_controls(value), style=style)


def print_json(data: Any) -> None:
    # ensure_ascii: every control character, C1 included, is written as a \\u escape
    sys.stdout.write(json.dumps(data, indent=2, default=str, ensure_ascii=True) + "\n")


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(escape_controls(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def describe_failure(error: BaseException) -> str:
    """One line for a failure that is not Crucible's own: what failed and, where we can, why."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    if isinstance(error, OperationalError):
        return (f"the database does not answer ({_one_line(str(error.orig or error).splitlines()[0])}); check "
                "CRUCIBLE_DATABASE_URL or run `crucible doctor`")
    if isinstance(error, DBAPIError):
        return f"the database refused the request: {_one_line(str(error.orig or error).splitlines()[0])}"
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}"
    return f"unexpected {type(error).__name__}: {_one_line(str(error)) or 'no message'}"


def print_error(message: str) -> None:
    err_console.print(Text.assemble(("error:", "bold red"), " ", _one_line(message, limit=2000)), soft_wrap=True)


@contextmanager
def readable_errors() -> Iterator[None]:
    """Turn Crucible's own errors into one red line and exit code 2 — no traceback (unless --debug)."""
    try:
        yield
    except CrucibleError as error:
        if debug_enabled():
            raise
        print_error(str(error))
        raise typer.Exit(2) from None


class CrucibleGroup(TyperGroup):
    """The root command: any failure a command did not turn into a line itself becomes one line."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):  # usage errors and exits speak for themselves
            raise
        except CrucibleError as error:
            if debug_enabled():
                raise
            print_error(str(error))
            raise typer.Exit(2) from None
        except Exception as error:
            if debug_enabled():
                raise
            print_error(f"{describe_failure(error)} (`crucible --debug …` shows the traceback)")
            raise typer.Exit(1) from None


def interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler that makes SIGTERM what Ctrl-C is (KeyboardInterrupt): a command that started
    servers in their own process groups stops them on the way out instead of dying past them."""
    raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM is Ctrl-C (`interrupt`), so its `finally` clauses run on `kill` too;
    the previous handler afterwards. Outside the main thread (where Python cannot set handlers) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
