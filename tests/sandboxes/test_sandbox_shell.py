"""The persistent shell session and file transfer, against a real container."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.tar import extract_to, pack_path
from sandboxes import (
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    StepStatus,
    create_sandbox,
)
from sandboxes.admin import history

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sandbox(backend: SandboxBackend, base_spec: SandboxSpec) -> Iterator[Sandbox]:
    spec = base_spec.model_copy(update={"output_head": 1000, "output_tail": 1000})
    sb = create_sandbox(backend=backend, spec=spec)
    yield sb
    sb.destroy()


def test_cwd_and_environment_persist_between_steps(sandbox: Sandbox) -> None:
    first = sandbox.step("mkdir -p /tmp/work && cd /tmp/work && export FOO=bar && X=local; pwd")
    assert (first.status, first.exit_code, first.stdout) == (StepStatus.OK, 0, "/tmp/work\n")
    second = sandbox.step('pwd; echo "$FOO $X"; f() { echo fn; }')
    assert second.stdout == "/tmp/work\nbar local\n"
    assert sandbox.step("f").stdout == "fn\n"  # functions persist too (until a restart)


def test_exit_codes_and_stderr_are_captured(sandbox: Sandbox) -> None:
    result = sandbox.step("echo out; echo err >&2; sh -c 'exit 7'")
    assert result.exit_code == 7
    assert result.stdout == "out\nerr\n"
    assert sandbox.step("false").exit_code == 1


def test_commands_cannot_read_the_control_channel(sandbox: Sandbox) -> None:
    assert sandbox.step("cat").stdout == ""
    assert sandbox.step('read -r line; echo "[$line]"').stdout == "[]\n"


def test_quotes_heredocs_and_syntax_errors(sandbox: Sandbox) -> None:
    assert sandbox.step("cat <<'EOF'\na 'b' \"c\" $d\nEOF").stdout == "a 'b' \"c\" $d\n"
    broken = sandbox.step("echo 'unterminated")
    assert broken.exit_code == 2 and "unexpected EOF" in broken.stdout
    assert sandbox.step("echo still here").stdout == "still here\n"


def test_non_utf8_and_binary_output_never_break_anything(sandbox: Sandbox) -> None:
    result = sandbox.step(r"printf 'ok \xff\xfe\x00 end'; head -c 3000 /dev/urandom")
    assert result.status in (StepStatus.OK, StepStatus.OUTPUT_TRUNCATED)
    assert result.stdout.startswith("ok \ufffd\ufffd")
    assert sandbox.step("echo fine").stdout == "fine\n"


def test_output_is_capped_head_and_tail_with_the_truncated_count(sandbox: Sandbox) -> None:
    result = sandbox.step("seq 1 100000")
    total = sum(len(f"{i}\n") for i in range(1, 100001))
    assert result.status is StepStatus.OUTPUT_TRUNCATED
    assert result.output_bytes == total
    assert result.truncated_bytes == total - 2000
    assert result.stdout.startswith("1\n2\n3\n")
    assert result.stdout.endswith("99999\n100000\n")
    assert f"[... {total - 2000} bytes truncated ...]" in result.stdout


def test_timeout_kills_the_command_and_restores_cwd_and_exports(sandbox: Sandbox) -> None:
    sandbox.step("cd /tmp && export KEPT=yes")
    result = sandbox.step("(sleep 300 &); sleep 300", timeout_s=1)
    assert (result.status, result.exit_code, result.shell_restarted) == (StepStatus.TIMEOUT, 124, True)
    assert "timed out after 1s" in result.stdout
    after = sandbox.step('pwd; echo "$KEPT"; ps -u agent -o comm= | grep -c "^sleep$"')
    assert after.stdout.splitlines() == ["/tmp", "yes", "0"]  # nothing it started outlived the deadline


def test_a_builtin_busy_loop_times_out_too(sandbox: Sandbox) -> None:
    result = sandbox.step("while :; do :; done", timeout_s=1)
    assert result.status is StepStatus.TIMEOUT
    assert sandbox.step("echo alive").stdout == "alive\n"


def test_an_exit_code_line_split_by_the_drivers_read_timer_is_reassembled(sandbox: Sandbox) -> None:
    # Regression: on a loaded machine the driver's `read -t` (250 ms slices) could fire after reading
    # only the first bytes of the user shell's "<seq> <token> <rc>" line; those bytes were dropped, the
    # rest never matched, and a command that had finished was reported as a 120 s timeout. Here the
    # command answers for itself (it runs in the shell, so it may: fd 11 is where bash saved the shell's
    # answer pipe during the command) in two pieces with a pause longer than a slice, which forces the
    # split. The shell's own "<seq> <token> 0" line follows; a driver that reassembles lines answers 42.
    answer = '"$__crucible_seq $__crucible_tok"'
    split = f"printf %s {answer} >&11; sleep 1; printf ' 42\\n' >&11"
    result = sandbox.step(split, timeout_s=20)
    assert (result.status, result.exit_code, result.shell_restarted) == (StepStatus.OK, 42, False)
    assert sandbox.step("echo next").stdout == "next\n"  # the late "<seq> <token> 0" line is skipped


def test_exit_starts_a_new_shell_in_the_last_directory(sandbox: Sandbox) -> None:
    sandbox.step("cd /home/agent")
    result = sandbox.step("exit 3")
    assert (result.exit_code, result.status, result.shell_restarted) == (3, StepStatus.OK, True)
    assert sandbox.step("pwd").stdout == "/home/agent\n"


def test_killing_the_shell_restarts_it(sandbox: Sandbox) -> None:
    sandbox.step("cd /tmp")
    result = sandbox.step("kill -9 $$")
    assert result.shell_restarted and result.exit_code == 137
    assert result.status is not StepStatus.SANDBOX_DEAD
    assert sandbox.step("pwd").stdout == "/tmp\n"
    assert sandbox.healthy and sandbox.is_running()


def test_killing_every_process_of_the_agent_leaves_the_driver_alone(sandbox: Sandbox) -> None:
    # The driver is root's: `kill -9 -1` from the agent reaches the agent's processes only.
    sandbox.step("(sleep 600 &)")
    result = sandbox.step("kill -9 -1; echo survived")
    assert (result.status, result.exit_code, result.stdout) == (StepStatus.OK, 0, "survived\n")
    # SIGKILLed is not yet gone: on a loaded machine the sleep was still listed once right after. Dead
    # (a zombie, until init reaps it) counts as gone; anything alive after 30 s fails.
    alive = "ps -u agent -o stat=,comm= | awk '$1 !~ /^Z/ && $2 == \"sleep\"' | wc -l"
    for _ in range(60):
        if (left := sandbox.step(alive).stdout) == "0\n":
            break
        time.sleep(0.5)
    assert left == "0\n", left
    assert sandbox.healthy


def test_history_records_every_command_with_exit_code(sandbox: Sandbox) -> None:
    sandbox.step("echo history-marker; false")
    entries = history(sandbox)
    last = [e for e in entries if "history-marker" in e.command][-1]
    assert last.exit_code == 1 and last.status == "ok" and last.duration_s >= 0


def test_files_round_trip(sandbox: Sandbox, tmp_path: Path) -> None:
    blob = bytes(range(256)) * 100
    sandbox.put_files({"notes/a.txt": b"hello\n", "/tmp/blob.bin": blob})
    assert sandbox.get_file("/workspace/notes/a.txt") == b"hello\n"
    assert sandbox.get_file("/tmp/blob.bin") == blob
    assert sandbox.step("stat -c %U /workspace/notes/a.txt").stdout == "agent\n"

    tree = tmp_path / "repo"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "main.py").write_text("print('hi')\n")
    (tree / "data.bin").write_bytes(blob)
    sandbox.put_path(tree, dest="/workspace/in")
    assert sandbox.step("python3 /workspace/in/repo/src/main.py").stdout == "hi\n"

    names = extract_to(sandbox.get_archive("/workspace/in/repo"), tmp_path / "out")
    assert "repo/src/main.py" in names
    assert (tmp_path / "out" / "repo" / "data.bin").read_bytes() == blob
    with tarfile.open(fileobj=io.BytesIO(pack_path(tree))) as tar:
        assert "repo/data.bin" in tar.getnames()


def test_files_cannot_be_written_outside_writable_mounts(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError, match="put /"):
        sandbox.put_files({"/etc/evil": b"x"})
    with pytest.raises(SandboxError, match="expected a readable file"):
        sandbox.get_file("/nonexistent")


def test_user_functions_cannot_hijack_the_shell_loop(sandbox: Sandbox) -> None:
    sandbox.step("printf() { :; }; read() { :; }; pwd() { echo fake; }; export() { :; }")
    assert sandbox.step("builtin pwd >/dev/null; echo still works").stdout == "still works\n"
    assert sandbox.step("unset -f printf read pwd export; echo ok").stdout == "ok\n"
