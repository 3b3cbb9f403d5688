"""The one poller of the suite: wait, with a generous deadline, until something is so. Never a timing
claim: the deadline only bounds how long a broken build hangs."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], *, timeout: float = 60.0, what: str = "condition",
             interval: float = 0.05, detail: Callable[[], str] | None = None) -> None:
    """Poll `predicate()` every `interval` s until it is truthy; AssertionError naming `what` (and
    `detail()`, e.g. a child's log, where given) once `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}"
                                 + (f":\n{detail()}" if detail is not None else ""))
        time.sleep(interval)
