"""What the CLI leaves behind: `ls --run` mid-run, and nothing left over by a SIGKILLed CLI process.

The SIGKILL tests run the real `crucible` console script in a child process and kill it mid-way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.sandbox import app
from sandboxes import Sandbox, SandboxBackend, SandboxSpec, create_sandbox
from sandboxes import labels as L
from sandboxes.admin import create_detached, prune
from sandboxes.reaper import Reaper
from tests.support.polling import wait_for

from .conftest import CLI_ENV_LABEL

# Sweeps, or runs a worker whose reaper sweeps, every crucible container on the machine: one xdist worker runs all of these.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]
runner = CliRunner()
CRUCIBLE = str(Path(sys.executable).with_name("crucible"))


def ls_run(run_id: int) -> list[dict[str, str]]:
    result = runner.invoke(app, ["ls", "--run", str(run_id), "-o", "json"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def leased(backend: SandboxBackend, base_spec: SandboxSpec) -> Iterator[Sandbox]:
    sandbox = create_sandbox(backend=backend, spec=base_spec)  # like a pool's: no run label at creation
    yield sandbox
    sandbox.destroy()


def test_ls_run_shows_the_sandboxes_a_run_holds_now(leased: Sandbox) -> None:
    run_id = 900_000 + os.getpid() % 10_000
    assert ls_run(run_id) == []
    assert leased.assign(run_id=run_id, episode_id=42)
    rows = ls_run(run_id)
    assert [(r["sandbox_id"], r["run"], r["episode"]) for r in rows] == [(leased.id, str(run_id), "42")]
    leased.unassign()
    assert leased.write_lease(state="idle")  # what the pool does when the episode gives it back
    assert ls_run(run_id) == []


def _ours(backend: SandboxBackend, env_label: str) -> list[str]:
    return [i.id for i in backend.list(labels={L.ENV: env_label})]


def test_prune_removes_at_once_what_a_sigkilled_create_left(backend: SandboxBackend, sandbox_images: dict[str, str]) -> None:
    # A seed of ~130 MB keeps the CLI inside creation long enough to be killed there.
    label = f"{CLI_ENV_LABEL}-kill-{os.getpid()}"
    child = subprocess.Popen(
        [CRUCIBLE, "sandbox", "create", "--image", sandbox_images["base"], "--seed", "/usr/lib",
         "--memory", "1g", "--ttl", "1h", "--env-name", label],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: bool(_ours(backend, label)), timeout=120, what="the CLI's container")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    [container_id] = _ours(backend, label)
    verdicts = prune(backend)
    mine = [v for v in verdicts if v.container_id == container_id]
    assert [(v.reason, v.removed) for v in mine] in ([("creator_dead", True)], [("not_running", True)])
    assert _ours(backend, label) == []


def test_prune_keeps_a_finished_detached_sandbox(backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    sandbox = create_detached(backend, spec=base_spec, env_name=CLI_ENV_LABEL)
    try:
        sandbox.close_session()
        info = backend.get(sandbox.container_id)
        assert info is not None
        # Judged as after `crucible sandbox create` returned: its creator is gone, its lease is written.
        gone = replace(info, labels={**info.labels, L.CREATOR: f"{L.Owner.current().host}:999999999:1"})
        assert Reaper(backend=backend).judge(gone) is None
    finally:
        sandbox.destroy()


def test_a_sigkilled_exec_ends_its_command(backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    sandbox = create_detached(backend, spec=base_spec, env_name=CLI_ENV_LABEL)
    sandbox.close_session()

    def sleeping() -> bool:
        ps = sandbox.exec(["ps", "-u", "1000", "-o", "args="], as_keeper=True)
        return "sleep 3600" in ps.output.decode()

    try:
        child = subprocess.Popen([CRUCIBLE, "sandbox", "exec", "--timeout", "3600", sandbox.id, "--", "sleep 3600"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(sleeping, timeout=120, what="the command to start")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        wait_for(lambda: not sleeping(), timeout=60, what="the command to end with its caller")
        assert sandbox.step("echo usable").stdout == "usable\n"
    finally:
        sandbox.destroy()
