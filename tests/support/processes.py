"""Child processes a test starts in their own session (`start_new_session=True`), stopped as a group."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(process: subprocess.Popen, *, grace_s: float = 60.0) -> None:  # type: ignore[type-arg]
    """SIGTERM to the process's group (a clean stop: a worker returns its sandboxes), SIGKILL after
    `grace_s`; nothing if it has exited."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
