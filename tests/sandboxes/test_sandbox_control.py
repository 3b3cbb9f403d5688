"""The shell's control channel against a hostile agent: nothing it can write, fill, forge or delete.

The driver (root, CAP_SETUID/SETGID/KILL only) keeps its fifos, lease, history and the per-step output
files on root-owned tmpfs; the agent's commands run as uid 1000. Each test attacks from inside the
sandbox as the agent and then checks that the attack failed, or was reported as a fault (never `ok`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandboxes import Sandbox, SandboxBackend, SandboxSpec, StepStatus, create_sandbox
from sandboxes.admin import history
from sandboxes.layout import CAPTURE_DIR, CONTROL_DIR, HISTORY_DIR, LEASE_FILE

pytestmark = pytest.mark.docker

MB = 1 << 20


@pytest.fixture
def sandbox(backend: SandboxBackend, base_spec: SandboxSpec) -> Iterator[Sandbox]:
    sb = create_sandbox(backend=backend, spec=base_spec)  # capture_size 16m, output head + tail 8k each
    yield sb
    sb.destroy()


def _lease(sandbox: Sandbox) -> str:
    return sandbox.exec(["cat", LEASE_FILE], as_control=True).output.decode()


def test_500_steps_of_1mb_output_each_return_their_output_and_exit_code(sandbox: Sandbox) -> None:
    # Today's failure: a 64 MB capture purged every 256 steps; past it every step said exit 1, `ok`,
    # no output. Here the capture is 16 MB, so 500 MB of output is 31 times what it holds.
    head, tail = sandbox.spec.output_head, sandbox.spec.output_tail
    for i in range(500):
        marker = f"step-{i:03d}"
        command = f"printf '{marker}'; head -c {MB - 2 * len(marker)} /dev/zero | tr '\\0' x; printf '{marker}'; (exit {i % 7})"
        result = sandbox.step(command, timeout_s=60)
        assert (result.status, result.exit_code) == (StepStatus.OUTPUT_TRUNCATED, i % 7), (i, result.stdout[-300:])
        assert (result.output_bytes, result.truncated_bytes) == (MB, MB - head - tail), i
        assert result.stdout.startswith(marker + "x") and result.stdout.endswith("x" + marker), i
    assert sandbox.health_check()


def test_the_agent_cannot_write_list_or_delete_the_control_files(sandbox: Sandbox) -> None:
    before = _lease(sandbox)
    sandbox.step("echo before-attack")
    attacks = [
        f"echo 0 > {LEASE_FILE}",
        f"echo '9999999999 - - idle' > {LEASE_FILE}.new && mv {LEASE_FILE}.new {LEASE_FILE}",
        f"rm -f {LEASE_FILE}",
        f"echo forged >> {HISTORY_DIR}/index.tsv",
        f"rm -rf {HISTORY_DIR}",
        f"ls {HISTORY_DIR}",
        f"ls {CONTROL_DIR}/sessions",
        f"echo 0 > {CONTROL_DIR}/sessions/*/rc.fifo",
        f"ls {CAPTURE_DIR}/*/",
        f"echo x > {CAPTURE_DIR}/forged",
        f"dd if=/dev/zero of={CONTROL_DIR}/fill bs=1M count=64",
        f"dd if=/dev/zero of={CAPTURE_DIR}/fill bs=1M count=64",
        f"rm -rf {CONTROL_DIR}/* {CAPTURE_DIR}/*",
        f"cp /bin/true {CONTROL_DIR}/bin/bash",
    ]
    for attack in attacks:
        result = sandbox.step(attack)
        assert result.status is StepStatus.OK, attack
        assert result.exit_code != 0, f"{attack!r} succeeded: {result.stdout}"
        assert "Permission denied" in result.stdout or "Operation not permitted" in result.stdout, (attack, result.stdout)
    assert _lease(sandbox) == before
    commands = [entry.command for entry in history(sandbox)]
    assert "echo before-attack" in commands and attacks[-1] in commands
    assert sandbox.step("echo intact").stdout == "intact\n" and sandbox.health_check()


def test_the_shells_answer_pipe_is_out_of_reach_of_other_processes(sandbox: Sandbox) -> None:
    # The user shell runs from a copy of bash the agent may run but not read: the kernel marks it
    # non-dumpable, so another process of the same uid cannot open its pipes through /proc.
    result = sandbox.step(
        "python3 -c 'import os; p = os.getppid(); os.open(f\"/proc/{p}/fd/1\", os.O_WRONLY)' 2>&1 | tail -1;"
        " echo 0 > /proc/$$/fd/11"
    )
    assert result.status is StepStatus.OK
    assert result.stdout.count("Permission denied") == 2, result.stdout


def test_an_answer_forged_for_a_later_command_is_a_fault(sandbox: Sandbox) -> None:
    # A command hands its shell's saved answer pipe (fd 11) to a process it leaves behind, which
    # answers "exit 0" for the next command. It cannot know that command's token: a fault, never ok.
    started = sandbox.step(
        "(while [ ! -e /tmp/go ]; do sleep 0.05; done; echo \"$((__crucible_seq + 1)) 0 0\" >&11) >/dev/null 2>&1 &"
    )
    assert started.status is StepStatus.OK
    result = sandbox.step("touch /tmp/go; sleep 2; false")
    assert result.status is StepStatus.CONTROL_FAULT and result.exit_code == -1
    assert "control_tampered" in result.stdout
    assert not sandbox.healthy  # the pool retires it


def test_a_capture_filled_by_a_background_process_is_a_fault_and_fails_the_health_check(sandbox: Sandbox) -> None:
    # A process keeps the output file of an early step and, once the driver has let go of that file
    # (quiet for four steps, then unlinked with a batch of 32), writes more than the capture holds.
    # The command that runs meanwhile loses its output: that step and every health check are a fault,
    # never `ok` with empty output.
    sandbox.step("(while [ ! -e /tmp/go ]; do sleep 0.05; done; head -c 20M /dev/zero; touch /tmp/done; sleep 600) &")
    for _ in range(40):
        assert sandbox.step("true").status is StepStatus.OK
    result = sandbox.step("touch /tmp/go; while [ ! -e /tmp/done ]; do sleep 0.05; done; echo lost")
    assert result.status is StepStatus.CONTROL_FAULT and "capture_full" in result.stdout
    assert not sandbox.health_check()
    assert not sandbox.healthy


def test_a_chatty_background_process_never_fills_the_capture(sandbox: Sandbox) -> None:
    # Its output goes to the file of the step that started it; that file is emptied at every step.
    sandbox.step("(for i in $(seq 400); do head -c 100000 /dev/zero; sleep 0.02; done) &")
    for i in range(60):
        result = sandbox.step(f"head -c 500000 /dev/zero | tr '\\0' y; echo {i}")
        assert (result.status, result.output_bytes) == (StepStatus.OUTPUT_TRUNCATED, 500000 + len(f"{i}\n")), i
    assert sandbox.health_check()


def test_a_full_control_tmpfs_is_a_fault_and_fails_the_health_check(sandbox: Sandbox) -> None:
    # The agent cannot fill it (see above); if the driver's own files ever did, that is infrastructure.
    filled = sandbox.exec(["sh", "-c", f"cat /dev/zero > {CONTROL_DIR}/fill"], as_control=True)
    assert b"No space left" in filled.stderr + filled.output
    result = sandbox.step("echo hello")
    assert result.status is StepStatus.SANDBOX_DEAD and "control_full" in result.stdout
    assert not sandbox.health_check()


def test_no_process_of_the_agent_holds_a_capability(sandbox: Sandbox) -> None:
    result = sandbox.step("grep -h '^CapEff' /proc/$$/status /proc/self/status; id -u")
    assert result.stdout == "CapEff:\t0000000000000000\nCapEff:\t0000000000000000\n1000\n"


SHIMMED = ("stat", "head", "tail", "timeout", "tar", "cat", "test", "rm", "mkdir", "mkfifo", "install", "mv",
           "env", "setsid", "nice", "setpriv", "kill", "basename")


def test_our_processes_never_run_the_agents_files(backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    # An environment whose PATH starts in the workspace (a venv, say) and whose BASH_ENV is the
    # agent's file: every program the root driver, a control exec or a keeper exec runs must still be
    # the image's own. The shims log who ran them, then run the real program.
    spec = base_spec.model_copy(update={"env": (("BASH_ENV", "/workspace/env.sh"), ("PATH", "/workspace/bin:/usr/bin:/bin"))})
    sandbox = create_sandbox(backend=backend, spec=spec)
    try:
        # One log per uid (root may not append to the agent's file in sticky /tmp: protected_regular).
        log = ": >>/tmp/ran-as.$(/usr/bin/id -u)"
        shim = f'#!/bin/sh\n{log}\nexec /usr/bin/"$(/usr/bin/basename "$0")" "$@"\n'
        files = {f"bin/{name}": shim.encode() for name in SHIMMED}
        sandbox.put_files({**files, "env.sh": f"{log}\n".encode()})
        assert sandbox.step("chmod +x bin/*; cat env.sh").exit_code == 0  # (the agent runs shims: fine)
        sandbox.step("seq 1 5000")  # output: the driver forks stat, head, tail
        assert history(sandbox)  # a control exec (tar)
        sandbox.close_session()
        sandbox.step("echo new session")  # driver start: mkdir, mkfifo, install, env, setsid, nice, setpriv
        assert _lease(sandbox)
        from sandboxes.reaper import Reaper

        assert Reaper(backend=backend)._read_lease(backend.get(sandbox.container_id)) is not None  # keeper exec
        ran_as = sandbox.exec(["/usr/bin/ls", "/tmp"], as_keeper=True).output.decode().split()
        assert [name for name in ran_as if name.startswith("ran-as.")] == ["ran-as.1000"], ran_as
    finally:
        sandbox.destroy()
