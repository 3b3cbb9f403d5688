"""Child processes a test starts in their own session (`start_new_session=True`), stopped as a group."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


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


def spawn_crucible(log: Path, *args: str, env: dict[str, str]) -> subprocess.Popen:  # type: ignore[type-arg]
    """`crucible ARGS` as a child in its own session (stop it with stop_group), its output to `log`."""
    from tests.api.live_server import ROOT, crucible_command

    with log.open("wb") as sink:
        return subprocess.Popen(crucible_command(*args), cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)


def launch_calc_eval(api_url: str, *, headers: dict[str, str], name: str) -> int:
    """One eval run of one group of one episode on the `calc` environment, through the REST API; its id."""
    import httpx

    launched = httpx.post(f"{api_url}/v1/runs", headers=headers, timeout=30, json={
        "name": name, "model": "scripted", "purpose": "eval", "group_size": 1, "batch_size": 1, "max_groups": 1,
        "environments": [{"name": "calc"}]})
    assert launched.status_code == 201, launched.text
    return int(launched.json()["id"])
