"""(issue 24, item 8) Ctrl-C leaves nothing behind: no vLLM, no worker, controller, trainer or judge,
no temporary directory of theirs.

The recipes (`make demo`, `make rl-browser`, `make rl-mixed`) start every server they run through one
place, recipes.common.Processes (vLLM, the worker, the controller, then the trainer and the reward model
they spawn on it); `crucible serve` starts its own vLLM. Each is run here for real and interrupted as
a terminal does (SIGINT to its process group): while vLLM is still starting its engine, and — for
Processes, with every kind of child up — mid-run, by SIGINT and by SIGTERM (those marked slow run in
`make test-all`). Afterwards no process carrying the test's
mark in its environment is alive (vLLM's engine processes included) and its temporary directory is
empty. The recipes' own stages before the servers (images, SFT) take minutes; `test_recipes_start_
servers_only_through_processes` holds that they start none elsewhere.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.api.live_server import ROOT, crucible_env
from tests.support.polling import wait_for

# The worker's reaper sweeps every crucible container on the machine: with the other tests that do.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]

MARK = "CRUCIBLE_TEST_INTERRUPT_MARK"

DRIVER = """
import sys, time
from pathlib import Path
from rich.console import Console
from recipes.common import Processes
from tests.support.polling import wait_for

workdir, model = Path(sys.argv[1]), Path(sys.argv[2])
(workdir / "logs").mkdir(parents=True, exist_ok=True)
with Processes(workdir=workdir, served_dir=model, console=Console(), startup_timeout_s=600, max_model_len=512) as procs:
    procs.spawn("trainer", [sys.executable, "-c", "import time; time.sleep(600)"])  # as launch_training does
    procs.spawn("reward-model", [sys.executable, "-c", "import time; time.sleep(600)"])  # as rl-mixed does
    print("every child up", flush=True)
    time.sleep(600)
"""


def _marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries `mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        if f"{MARK}={mark}".encode() in environ:
            found.append((int(entry.name), cmdline[:200]))
    return found


def _takes_ctrl_c() -> None:
    """In the child before it runs: SIGINT as at a terminal. A suite started as a shell's background job
    (`pytest … &`) runs with SIGINT ignored, its children inherit that, and Python then keeps it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_and_check(command: list[str], *, tmp_path: Path, ready: Callable[[str, list[tuple[int, str]]], bool],
                         what: str, sig: signal.Signals = signal.SIGINT) -> str:
    """Run `command` (marked, its own session and temporary directory), wait until `ready(output,
    marked processes)`, send `sig` to its process group, and check it ended leaving nothing behind."""
    # A short TMPDIR of its own: vLLM puts ZeroMQ IPC sockets in it, whose paths must fit in 107 bytes
    # (pytest's tmp_path does not).
    mark, tmp = uuid.uuid4().hex, Path(tempfile.mkdtemp(prefix="ci-", dir="/tmp"))
    log = tmp_path / "command.log"
    env = {**crucible_env(data_dir=str(tmp_path / "data")), MARK: mark, "TMPDIR": str(tmp)}
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=_takes_ctrl_c)
    try:
        wait_for(lambda: process.poll() is None and ready(log.read_text(errors="replace"), _marked(mark)), what=what,
                 timeout=400, interval=0.1, detail=lambda: log.read_text(errors="replace")[-3000:])
        os.killpg(process.pid, sig)  # what a terminal's Ctrl-C does: the foreground process group
        process.wait(timeout=120)
        left = _marked(mark)
        output = log.read_text(errors="replace")
        assert left == [], (left, output[-3000:])
        assert list(tmp.iterdir()) == [], (list(tmp.iterdir()), output[-3000:])
        return output
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for pid, _ in _marked(mark):  # never leave them to the next test
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def _vllm_starting(_: str, marked: list[tuple[int, str]]) -> bool:
    """vLLM's API server is up and has started a process of its own (its engine), not yet healthy."""
    return any("vllm.entrypoints" in cmdline for _, cmdline in marked) and len(marked) >= 3


def test_ctrl_c_while_crucible_serve_starts_vllm_leaves_no_vllm(tiny_model_dir: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "cli.main", "serve", str(tiny_model_dir), "--port", "0",
               "--max-model-len", "512", "--log-file", str(tmp_path / "vllm.log")]
    _interrupt_and_check(command, tmp_path=tmp_path, ready=_vllm_starting, what="vLLM to start its engine")


@pytest.mark.slow  # ~30 s: the same VllmServer.start as `crucible serve` above, under Processes.__enter__
def test_ctrl_c_while_a_recipe_starts_vllm_leaves_no_vllm(tiny_model_dir: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-c", DRIVER, str(tmp_path / "work"), str(tiny_model_dir)]
    _interrupt_and_check(command, tmp_path=tmp_path, ready=_vllm_starting, what="vLLM to start its engine")


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["ctrl-c", "sigterm"])  # ~1 min each: SIGTERM takes the same path once it is Ctrl-C
def test_interrupting_a_recipe_mid_run_stops_vllm_and_every_child(
    tiny_model_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    command = [sys.executable, "-c", DRIVER, str(tmp_path / "work"), str(tiny_model_dir)]
    _interrupt_and_check(command, tmp_path=tmp_path, ready=lambda output, _: "every child up" in output,
                         what="vLLM, the worker, the controller, a trainer and a reward model", sig=sig)


def _calls(tree: ast.AST) -> set[str | None]:
    return {getattr(node.func, "attr", getattr(node.func, "id", None)) for node in ast.walk(tree)
            if isinstance(node, ast.Call)}


def test_recipes_start_servers_only_through_processes() -> None:
    """What the interrupt tests above hold for Processes holds for the recipes: none of them starts a
    long-lived process or a server any other way (subprocess.run runs one-shot CLI steps to their end)."""
    starters = {"Popen", "VllmServer", "start_all", "launch"}
    for path in [ROOT / "recipes" / "demo.py", ROOT / "recipes" / "browser_rl.py", ROOT / "recipes" / "mixed_rl.py"]:
        assert _calls(ast.parse(path.read_text())) & starters == set(), path
    demo = ast.parse((ROOT / "recipes" / "common.py").read_text())
    processes = next(node for node in ast.walk(demo) if isinstance(node, ast.ClassDef) and node.name == "Processes")
    elsewhere = [node for node in demo.body if node is not processes]
    assert set().union(*(_calls(node) for node in elsewhere)) & starters == set()
    assert _calls(processes) & starters == {"Popen", "VllmServer"}  # the test holds for something
