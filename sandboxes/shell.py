"""ShellSession: the host end of a persistent shell inside a sandbox (see driver.py for the other end).

    session = ShellSession(open_stream=opener, output_head=16384, output_tail=16384)
    session.start()                                    # one docker exec, kept open
    result = step_result(session.run("cd src && ls", timeout_s=30), timeout_s=30)

One exec is started per session and kept attached; each step is one framed write and one framed
read on that socket: no docker exec per command. Output is decoded with errors="replace", so binary
output never breaks anything.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sandboxes.driver import DRIVER, RESET_PRELUDE, USER_SHELL
from sandboxes.errors import SessionError
from sandboxes.layout import CAPTURE_DIR, CONTROL_DIR, SHELL_STATE_PREFIX, privileged_argv
from sandboxes.stream import ExecStream, StreamClosed, StreamTimeout

log = logging.getLogger(__name__)

KILL_GRACE_S = 2.0  # the driver's SIGTERM -> SIGKILL gap, like `timeout -k 2`
REPLY_SLACK_S = 15.0  # extra host-side patience for the reply (noisy machines, output transfer)
_MARK = b"\x1e\x1eCRUCIBLE "
StreamOpener = Callable[[Sequence[str]], ExecStream]


class StepStatus(StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"
    OOM = "oom"
    OUTPUT_TRUNCATED = "output_truncated"
    SANDBOX_DEAD = "sandbox_dead"
    CONTROL_FAULT = "control_fault"
    """The agent's processes interfered with the control channel (forged an answer, filled the capture)."""


# Driver statuses that are faults, never `ok`: the sandbox cannot report this command truthfully.
INFRA_FAULTS = {"control_full": "the sandbox's control files could not be written (its control tmpfs is full)"}
AGENT_FAULTS = {
    "capture_full": "the output capture space is held by a background process; this command's output is lost",
    "control_tampered": "an answer for this command was forged by another process",
}


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What one command did. `stdout` holds stdout and stderr interleaved, capped head + tail."""

    stdout: str
    exit_code: int
    duration_s: float
    status: StepStatus
    truncated_bytes: int = 0
    output_bytes: int = 0
    shell_restarted: bool = False

    @property
    def output(self) -> str:
        """Alias of `stdout` (stdout and stderr are captured together)."""
        return self.stdout


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One framed answer from the driver."""

    seq: int
    rc: int
    status: str
    size: int
    head: bytes
    tail: bytes
    duration_s: float


class SessionDied(SessionError):
    """The driver process ended (killed, container gone)."""


class SessionTimeout(SessionError):
    """The driver did not answer in time; the session is unusable."""


class ShellSession:
    """One attached driver process. Not thread-safe by itself: Sandbox serialises calls."""

    def __init__(
        self,
        *,
        open_stream: StreamOpener,
        output_head: int,
        output_tail: int,
        user: str = "1000:1000",
        capture_size: int = 64 << 20,
        restore_from: str | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.nonce = secrets.token_hex(8)
        self._open_stream = open_stream
        self._head = output_head
        self._tail = output_tail
        self._uid, self._gid = user.split(":")
        self._capture_size = capture_size
        self._restore_from = restore_from or ""
        self._start_timeout_s = start_timeout_s
        self._stream: ExecStream | None = None
        self._seq = 0
        self._lock = threading.Lock()

    @property
    def ctl_dir(self) -> str:
        return f"{CONTROL_DIR}/sessions/{self.nonce}"

    @property
    def state_prefix(self) -> str:
        """Where this session's user shell checkpoints cwd (.cwd) and exported variables (.env)."""
        return f"{SHELL_STATE_PREFIX}-{self.nonce}"

    @property
    def alive(self) -> bool:
        return self._stream is not None and not self._stream.eof

    def start(self) -> None:
        argv = privileged_argv([  # the driver is root's: nothing of the container's environment reaches it
            "bash", "--noprofile", "--norc", "-c", DRIVER, "crucible-driver", self.nonce,
            str(self._head), str(self._tail), CONTROL_DIR, CAPTURE_DIR, self._restore_from, USER_SHELL,
            self._uid, self._gid, SHELL_STATE_PREFIX, RESET_PRELUDE, str(self._capture_size),
        ])
        self._stream = self._open_stream(argv)
        try:
            reply = self._read_reply(0, deadline=time.monotonic() + self._start_timeout_s)
        except SessionError as error:
            detail = bytes(self._stream.stderr).decode(errors="replace").strip()[-500:]
            self.close()
            raise SessionError(f"shell session: expected a ready driver, got {error} {detail}".strip()) from None
        if reply.status != "ready":
            self.close()
            raise SessionError(f"shell session: expected a ready driver, got status {reply.status!r}")

    def run(self, command: str | bytes, *, timeout_s: float) -> Reply:
        """Run one command in the persistent shell; the driver enforces `timeout_s`."""
        data = command.encode("utf-8", "surrogateescape") if isinstance(command, str) else command
        if b"\0" in data:
            raise ValueError("command: expected text without NUL bytes, got a NUL byte")
        return self.request("x", data, arg=max(1, int(timeout_s * 1000)), wait_s=timeout_s + KILL_GRACE_S)

    def request(self, op: str, payload: bytes, *, arg: int = 0, wait_s: float = 10.0) -> Reply:
        """Send one framed request and wait for its reply (SessionDied / SessionTimeout on failure)."""
        with self._lock:
            stream = self._stream
            if stream is None or stream.eof:
                raise SessionDied("shell session: expected a running driver, got a closed session")
            self._seq += 1
            seq = self._seq
            try:
                stream.send(f"{op} {seq} {arg} {len(payload)}\n".encode() + payload)
                return self._read_reply(seq, deadline=time.monotonic() + wait_s + REPLY_SLACK_S)
            except SessionTimeout:
                self.close()  # a late reply would desynchronise every later request
                raise

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        if not stream.eof:
            with contextlib.suppress(SessionError):
                stream.send(b"q 0 0 0\n")
        stream.close()

    def _read_reply(self, seq: int, *, deadline: float) -> Reply:
        assert self._stream is not None
        stream = self._stream
        marker = _MARK + self.nonce.encode() + b" "
        try:
            while True:
                end = stream.read_until(marker, deadline=deadline)
                if end > len(marker):
                    log.debug("discarding %d stray bytes from the shell", end - len(marker))
                stream.take(end - len(marker))
                line_end = stream.read_until(b"\n", deadline=deadline)
                fields = stream.take(line_end)[len(marker) :].split()
                got_seq, rc, status, size, nh, nt, dur = fields
                stream.read_exact(int(nh) + int(nt), deadline=deadline)
                head, tail = stream.take(int(nh)), stream.take(int(nt))
                if int(got_seq) == seq:
                    return Reply(
                        seq=seq, rc=int(rc), status=status.decode(), size=int(size),
                        head=head, tail=tail, duration_s=int(dur) / 1e6,
                    )
        except StreamClosed as error:
            raise SessionDied(f"shell session ended: {error}") from None
        except StreamTimeout:
            raise SessionTimeout("shell session: expected a reply before the deadline, got none") from None
        except ValueError:
            raise SessionDied("shell session: expected a well-formed reply header, got garbage") from None


def step_result(reply: Reply, *, timeout_s: float) -> StepResult:
    """Map a driver reply to a StepResult (status priority: oom > timeout > output_truncated > ok)."""
    truncated = max(0, reply.size - len(reply.head) - len(reply.tail))
    text = reply.head.decode(errors="replace")
    if truncated:
        text += f"\n[... {truncated} bytes truncated ...]\n" + reply.tail.decode(errors="replace")
    restarted = reply.status in ("timeout", "exited", "pids_exhausted")
    if reply.status == "timeout":
        text += (
            f"\n[crucible: timed out after {timeout_s:g}s; the command and everything it started were killed;"
            " the shell restarted in the last working directory with the exported variables]"
        )
    elif reply.status == "pids_exhausted":
        text += (
            "\n[crucible: the sandbox's process limit was exhausted; the command and every process it left"
            " behind were killed; the shell restarted in the last working directory with the exported variables]"
        )
    elif reply.status == "exited":
        text += (
            f"\n[crucible: the shell exited with status {reply.rc}; a new shell starts in the last working"
            " directory with the exported variables]"
        )
    if reply.status in INFRA_FAULTS or reply.status in AGENT_FAULTS:
        note = INFRA_FAULTS.get(reply.status) or AGENT_FAULTS[reply.status]
        status = StepStatus.SANDBOX_DEAD if reply.status in INFRA_FAULTS else StepStatus.CONTROL_FAULT
        return StepResult(
            stdout=f"[crucible: {reply.status}: {note}]", exit_code=-1, duration_s=reply.duration_s, status=status,
            output_bytes=reply.size,
        )
    if reply.status == "oom":
        status = StepStatus.OOM
    elif reply.status == "timeout":
        status = StepStatus.TIMEOUT
    elif truncated:
        status = StepStatus.OUTPUT_TRUNCATED
    else:
        status = StepStatus.OK
    return StepResult(
        stdout=text, exit_code=reply.rc, duration_s=reply.duration_s, status=status,
        truncated_bytes=truncated, output_bytes=reply.size, shell_restarted=restarted,
    )


def dead_result(*, note: str, duration_s: float) -> StepResult:
    return StepResult(stdout=f"[crucible: {note}]", exit_code=-1, duration_s=duration_s, status=StepStatus.SANDBOX_DEAD)
