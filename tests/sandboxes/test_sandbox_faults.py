"""Bad input and faults: each ends with a clear status, and the pool keeps handing out healthy sandboxes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandboxes import (
    InMemoryEventSink,
    Sandbox,
    SandboxBackend,
    SandboxPool,
    SandboxSpec,
    StepResult,
    StepStatus,
)

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sink() -> InMemoryEventSink:
    return InMemoryEventSink()


@pytest.fixture(scope="module")
def pool(backend: SandboxBackend, base_spec: SandboxSpec, sink: InMemoryEventSink) -> Iterator[SandboxPool]:
    with SandboxPool(spec=base_spec, backend=backend, events=sink, min_size=1, max_size=3, max_uses=100) as p:
        yield p


def run_fault(pool: SandboxPool, command: str, *, timeout: float = 10) -> tuple[StepResult, Sandbox]:
    """Run `command` in a leased sandbox, give it back, and check the next lease is healthy."""
    sandbox = pool.acquire(run_id=None, episode_id=None, timeout_s=120)
    try:
        result = sandbox.step(command, timeout_s=timeout)
    finally:
        pool.release(sandbox)
    with pool.lease(timeout_s=120) as fresh:
        assert fresh.health_check()
        check = fresh.step("pwd; ls -A /workspace /tmp; ps -u agent -o comm= | grep -cvxE 'bash|ps|grep'")
        assert check.status is StepStatus.OK
        assert check.stdout.splitlines()[0] == "/workspace"
        assert check.stdout.splitlines()[-1] == "0"  # no stray process of the previous episode
    return result, sandbox


def test_fork_bomb(pool: SandboxPool) -> None:
    result, _ = run_fault(pool, ":(){ :|:& };:; sleep 3", timeout=5)
    assert result.shell_restarted
    assert "process limit was exhausted" in result.stdout or result.status is StepStatus.TIMEOUT


def test_memory_hog_is_oom_and_the_sandbox_retired(pool: SandboxPool, sink: InMemoryEventSink) -> None:
    result, sandbox = run_fault(pool, "python3 -c \"b = b'x' * (1 << 30)\"")
    assert result.status is StepStatus.OOM
    assert result.exit_code == 137
    assert "oom" in sink.kinds(sandbox.id)
    retire = [e for e in sink.events if e.sandbox_id == sandbox.id and e.kind == "retire"]
    assert retire and retire[0].detail["reason"] == "oom"


def test_cpu_spin_past_the_timeout(pool: SandboxPool, sink: InMemoryEventSink) -> None:
    result, sandbox = run_fault(pool, "python3 -c 'while True: pass'", timeout=1)
    assert (result.status, result.exit_code) == (StepStatus.TIMEOUT, 124)
    assert "timeout" in sink.kinds(sandbox.id)


def test_infinite_output_is_capped(pool: SandboxPool) -> None:
    result, _ = run_fault(pool, "yes crucible", timeout=20)
    assert result.status in (StepStatus.OUTPUT_TRUNCATED, StepStatus.TIMEOUT)
    assert result.truncated_bytes > 1_000_000
    assert len(result.stdout) < 20_000
    assert result.stdout.startswith("crucible\ncrucible\n")


def test_binary_output(pool: SandboxPool) -> None:
    result, _ = run_fault(pool, "head -c 100000 /dev/urandom; printf '\\x00\\xff'")
    assert result.status is StepStatus.OUTPUT_TRUNCATED
    assert result.output_bytes == 100002 and isinstance(result.stdout, str)


def test_writing_past_the_workspace_limit(pool: SandboxPool) -> None:
    result, _ = run_fault(pool, "dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1; echo rc=$?")
    assert result.status is StepStatus.OK
    assert "No space left on device" in result.stdout and "rc=1" in result.stdout


def test_no_network(pool: SandboxPool) -> None:
    probe = (
        "ls /sys/class/net; python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\""
        " 2>&1 | tail -1; getent hosts deb.debian.org || echo no-dns"
    )
    result, _ = run_fault(pool, probe)
    lines = result.stdout.splitlines()
    assert lines[0] == "lo"
    assert "Network is unreachable" in result.stdout
    assert lines[-1] == "no-dns"


def test_writing_outside_the_workspace(pool: SandboxPool) -> None:
    result, _ = run_fault(pool, "for p in /etc/x /usr/bin/x /x /var/tmp/x; do touch $p 2>&1; done; id -u")
    assert result.stdout.count("Read-only file system") + result.stdout.count("Permission denied") == 4
    assert result.stdout.splitlines()[-1] == "1000"


def test_killing_pid_1_is_not_permitted(pool: SandboxPool) -> None:
    result, _ = run_fault(pool, "kill -9 1; kill -TERM 1; kill -9 $(pgrep -x sleep)")
    assert result.exit_code != 0 and "Operation not permitted" in result.stdout
    assert result.status is StepStatus.OK


def test_killing_every_process_of_the_user(pool: SandboxPool) -> None:
    result, _ = run_fault(pool, "sleep 600 & kill -9 -1; echo alive")
    assert (result.status, result.stdout) == (StepStatus.OK, "alive\n")  # the shell and driver are out of reach


def test_background_process_that_outlives_its_command(pool: SandboxPool) -> None:
    result, _ = run_fault(pool, "nohup sleep 600 >/dev/null 2>&1 & setsid sleep 600 & echo started")
    assert (result.status, result.stdout) == (StepStatus.OK, "started\n")
