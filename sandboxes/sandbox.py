"""Sandbox: one container and its persistent shell — create → ready → step → reset → recycle/destroy.

    sandbox = create_sandbox(backend=make_backend(), spec=spec, events=sink)
    result = sandbox.step("pytest -q", timeout_s=120)     # StepResult, never raises for the command's fault
    sandbox.reset()                                     # ResetFailed -> destroy and replace
    sandbox.destroy(reason="done")                      # idempotent

Death policy: the agent can kill its own shell (the driver restarts it, see driver.py) but not the
driver, which is root's. If the driver dies mid-step anyway (the OOM killer chose it) and the
container still runs, a new session starts at once from the last checkpoint (cwd and exported
variables) and the step reports exit 137 with a note; only a container that is gone or cannot start
a process gives `sandbox_dead` (and marks the sandbox unhealthy, so pools retire it). A control
channel that is full or was tampered with gives `sandbox_dead` / `control_fault` and marks it
unhealthy too (see shell.step_result).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from core.tar import pack_path
from sandboxes import files as files_
from sandboxes.backend import ExecResult, SandboxBackend
from sandboxes.browser import BrowserSession
from sandboxes.errors import ResetFailed, SandboxDead, SandboxError, SessionError
from sandboxes.events import EventKind, EventRecorder
from sandboxes.layout import CONTROL_USER, KEEPER_USER, privileged_argv, sandbox_env
from sandboxes.openenv import OpenEnvSession
from sandboxes.reset import (
    BASELINE_SCRIPT,
    PRISTINE_GIT,
    RESET_TIMEOUT_S,
    reset_script,
    seed_command,
)
from sandboxes.shell import (
    SessionDied,
    ShellSession,
    StepResult,
    StepStatus,
    dead_result,
    step_result,
)
from sandboxes.spec import SandboxSpec
from sandboxes.stream import ExecStream

log = logging.getLogger(__name__)
D = TypeVar("D", bound=BrowserSession)
DEFAULT_LEASE_TTL_S = 600.0


class Sandbox:
    """A live container with a persistent shell. Calls are serialised; destroy may come from any thread."""

    def __init__(
        self,
        *,
        backend: SandboxBackend,
        container_id: str,
        sandbox_id: str,
        spec: SandboxSpec,
        events: EventRecorder,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        created_at: float | None = None,
        renew_lease: bool = True,
    ) -> None:
        self.backend = backend
        self.container_id = container_id
        self.id = sandbox_id
        self.spec = spec
        self.events = events
        self.lease_ttl_s = lease_ttl_s
        self.created_at = created_at or time.time()
        self.uses = 0
        self.healthy = True
        self.saw_oom = False
        self.is_repo = False
        self._session: ShellSession | None = None
        self._browser: BrowserSession | None = None
        self._openenv: OpenEnvSession | None = None
        self._lock = threading.RLock()
        self._destroy_lock = threading.Lock()
        self._destroyed = False
        self._lease_due = 0.0 if renew_lease else float("inf")

    def __repr__(self) -> str:
        return f"Sandbox({self.id}, container={self.container_id[:12]}, image={self.spec.image})"

    @property
    def image(self) -> str:
        return self.spec.image

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def age_s(self) -> float:
        return time.time() - self.created_at

    # -- commands -------------------------------------------------------------------------------
    def step(self, command: str | bytes, *, timeout_s: float | None = None) -> StepResult:
        """Run one command in the persistent shell (cwd and env persist); `timeout_s` in seconds (default: the
        spec's command_timeout_s)."""
        timeout = timeout_s or self.spec.command_timeout_s
        started = time.perf_counter()
        with self._lock:
            if self._destroyed:
                return dead_result(note="the sandbox was destroyed", duration_s=0.0)
            try:
                if time.monotonic() >= self._lease_due:
                    self.write_lease()
                reply = self._ensure_session().run(command, timeout_s=timeout)
            except SessionDied:
                return self._recover(started)
            except SandboxError as error:  # SessionTimeout, SandboxDead (cannot start a process), …
                return self._mark_dead(started, f"the sandbox stopped answering ({error})")
        result = step_result(reply, timeout_s=timeout)
        if result.status in (StepStatus.CONTROL_FAULT, StepStatus.SANDBOX_DEAD):
            # The channel cannot be trusted or written any more: never reuse this sandbox.
            self.healthy = False
            self.events.emit(EventKind.HEALTH_FAIL, status=reply.status, command=_excerpt(command))
        elif result.status is StepStatus.OOM:
            self.saw_oom = True
            self.events.emit(EventKind.OOM, duration_s=result.duration_s, command=_excerpt(command))
        elif result.status is StepStatus.TIMEOUT:
            self.events.emit(EventKind.TIMEOUT, duration_s=result.duration_s, command=_excerpt(command))
        return result

    def exec(
        self, argv: list[str], *, timeout_s: float = 60.0, stdin: bytes | None = None, as_keeper: bool = False,
        as_control: bool = False,
    ) -> ExecResult:
        """One-off process (its own docker exec): for control work and file transfer, not agent steps.

        `as_control` runs it as the owner of the control channel (root with layout.CONTROL_CAPS): only
        for reading the driver's files, never for anything that touches the agent's files.
        """
        user = CONTROL_USER if as_control else KEEPER_USER if as_keeper else self.spec.user
        return self.backend.exec(
            self.container_id, argv=argv, user=user, timeout_s=timeout_s, stdin=stdin, workdir=self.spec.workdir
        )

    def open_control(self, argv: list[str]) -> ExecStream:
        """A long-lived process of ours with its stdin/stdout attached (an agent program's bridge), run as the
        control user (root with only layout.CONTROL_CAPS) with a clean environment (layout.privileged_argv);
        never for the agent's own commands."""
        if self._destroyed:
            raise SandboxDead(f"sandbox {self.id}: expected a live sandbox, got it destroyed")
        return self.backend.open_exec(self.container_id, argv=privileged_argv(argv), user=CONTROL_USER, env={},
                                      workdir="/")

    # -- files (tar streams; see files.py) ----------------------------------------------------------
    def put_files(self, files: Mapping[str, bytes], *, dest: str | None = None) -> None:
        """Write {path: bytes}; relative paths are under `dest` (default: the workspace)."""
        files_.put_files(self, files, dest=dest or self.spec.workdir)

    def put_archive(self, data: bytes, *, dest: str | None = None) -> None:
        """Extract a tar into `dest` (default: the workspace)."""
        files_.put_archive(self, data, dest=dest or self.spec.workdir)

    def put_path(self, source: Path, *, dest: str | None = None) -> None:
        """Copy a local file or directory into `dest` (default: the workspace), keeping its name."""
        files_.put_archive(self, pack_path(source), dest=dest or self.spec.workdir)

    def get_file(self, path: str) -> bytes:
        return files_.get_file(self, path)

    def get_archive(self, path: str) -> bytes:
        """A tar of a file or directory, stored under its base name."""
        return files_.get_archive(self, path)

    def browser(self) -> BrowserSession:
        """The browser driver of a browser image (started on first use, kept across episodes: the
        pool's reset leaves it, its browser context is what each episode resets)."""
        return self._driver("_browser", BrowserSession, {})

    def openenv(self, **hello: Any) -> OpenEnvSession:
        """The OpenEnv bridge of an openenv image (started on first use with `hello`: the app, its folder and
        environment variables; kept across episodes, each of which opens its own session on the server)."""
        return self._driver("_openenv", OpenEnvSession, hello)

    def _driver(self, slot: str, kind: type[D], hello: dict[str, Any]) -> D:
        """The keeper-uid JSON-lines driver kept in `slot`, started anew when it is gone or was started with
        other `hello` settings (another spec's server on the same image). A driver that fails to start marks
        the sandbox unhealthy."""
        with self._lock:
            if self._destroyed:
                raise SandboxDead(f"sandbox {self.id}: expected a live sandbox, got it destroyed")
            driver = getattr(self, slot)
            if driver is None or not driver.alive or driver.hello != hello:
                if driver is not None:
                    driver.close()
                setattr(self, slot, None)
                backend, cid = self.backend, self.container_id
                driver = kind(lambda argv: backend.open_exec(cid, argv=argv, user=KEEPER_USER, env={}, workdir="/"),
                              hello=hello)
                try:
                    driver.start()
                except SandboxError:
                    self.healthy = False
                    raise
                setattr(self, slot, driver)
            return driver  # type: ignore[no-any-return]

    def _ensure_session(self, *, restore_from: str | None = None) -> ShellSession:
        if self._session is None or not self._session.alive:
            spec, backend, cid = self.spec, self.backend, self.container_id
            session = ShellSession(
                open_stream=lambda argv: backend.open_exec(
                    cid, argv=argv, user=CONTROL_USER, env=sandbox_env(spec), workdir=spec.workdir
                ),
                output_head=spec.output_head,
                output_tail=spec.output_tail,
                user=spec.user,
                capture_size=spec.capture_size,
                restore_from=restore_from,
            )
            session.start()
            self._session = session
        return self._session

    def _recover(self, started: float) -> StepResult:
        old, self._session = self._session, None
        if old is not None:
            old.close()
        if not self.is_running():
            return self._mark_dead(started, "the sandbox's container is gone")
        try:
            self._ensure_session(restore_from=old.state_prefix if old else None)
        except SandboxError as error:
            return self._mark_dead(started, f"could not start a new shell ({error})")
        return StepResult(
            stdout="[crucible: the shell was killed; a new shell started in the last working directory"
            " with the exported variables]",
            exit_code=137,
            duration_s=time.perf_counter() - started,
            status=StepStatus.OK,
            shell_restarted=True,
        )

    def _mark_dead(self, started: float, note: str) -> StepResult:
        self.healthy = False
        self.close_session()
        return dead_result(note=note, duration_s=time.perf_counter() - started)

    # -- lifecycle --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Ready check after create: start the shell, seed the workspace, record the git baseline."""
        with self._lock:
            self._ensure_session()
            if self.spec.workspace_seed:
                done = self.exec(["bash", "-c", seed_command(self.spec)], timeout_s=300)
                if done.exit_code != 0:
                    raise SandboxError(
                        f"workspace_seed: expected a directory {self.spec.workspace_seed} in {self.spec.image}, "
                        f"got: {done.output.decode(errors='replace').strip()[-300:]}"
                    )
                if done.output.strip() == b"repo":
                    self.capture_baseline()
            self.write_lease(state="idle")

    def capture_baseline(self) -> str:
        """Record the workspace repo's HEAD, refs and .git metadata; later resets return to it."""
        done = self.exec(
            ["bash", "-c", BASELINE_SCRIPT, "baseline", self.spec.workdir, PRISTINE_GIT], as_keeper=True
        )
        if done.exit_code != 0:
            raise SandboxError(
                f"baseline: expected a git repository at {self.spec.workdir}, "
                f"got: {(done.output + done.stderr).decode(errors='replace').strip()[-300:]}"
            )
        self.is_repo = True
        return done.output.decode().strip()

    def reset(self) -> None:
        """Back to the baseline, verified; raises ResetFailed (the caller then destroys and replaces)."""
        mode = "repo" if self.is_repo else "plain"
        with self._lock, self.events.timed(EventKind.RESET, mode=mode) as detail:
            if self._destroyed:
                raise ResetFailed(f"reset: expected a live sandbox, got {self.id} destroyed")
            script = reset_script(self.spec, repo=self.is_repo).encode()
            for attempt in (1, 2):
                try:
                    session = self._ensure_session()
                    reply = session.request("r", script, arg=int(RESET_TIMEOUT_S * 1000), wait_s=RESET_TIMEOUT_S)
                    break
                except SessionError as error:  # a dead driver: a fresh one kills the old and retries
                    self.close_session()
                    if attempt == 2 or not self.is_running():
                        raise ResetFailed(f"reset: expected a working shell, got {error}") from None
            output = (reply.head + reply.tail).decode(errors="replace").strip()
            detail["rc"] = reply.rc
            if reply.rc != 0 or not output.endswith("clean"):
                raise ResetFailed(f"reset: expected a verified clean sandbox, got: {output[-500:] or reply.status}")
            self.saw_oom = False

    def health_check(self) -> bool:
        """True if a trivial command runs in the shell; emits health_fail otherwise."""
        result = self.step("true", timeout_s=10)
        ok = result.status is StepStatus.OK and result.exit_code == 0 and not result.shell_restarted
        if not ok:
            self.healthy = False
            self.events.emit(EventKind.HEALTH_FAIL, status=result.status.value, exit_code=result.exit_code)
        return ok

    def is_running(self) -> bool:
        info = self.backend.get(self.container_id)
        return info is not None and info.running

    @property
    def lease_due(self) -> bool:
        return time.monotonic() >= self._lease_due

    def write_lease(self, *, state: str = "leased") -> bool:
        """Renew the lease the reaper reads (`expires run episode state` in /run/crucible/lease, root's)."""
        expires = time.time() + self.lease_ttl_s
        ev = self.events
        line = f"{int(expires)} {ev.run_id or '-'} {ev.episode_id or '-'} {state}"
        with self._lock:
            self._lease_due = time.monotonic() + self.lease_ttl_s / 3
            try:
                reply = self._ensure_session().request("l", line.encode())
            except SandboxError:
                self._lease_due = 0.0  # retried on the next step; the reaper may act on the label first
                return False
            return reply.rc == 0

    def assign(self, *, run_id: int | None, episode_id: int | None) -> bool:
        """Lease to an episode; False if the sandbox cannot even renew its lease (it is dead)."""
        self.events.run_id, self.events.episode_id = run_id, episode_id
        self.uses += 1
        return not self._destroyed and self.write_lease(state="leased")

    def unassign(self) -> None:
        self.events.run_id = self.events.episode_id = None

    def close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def destroy(self, *, reason: str = "destroy") -> None:
        """Remove the container. Idempotent, and safe while another thread is mid-step."""
        with self._destroy_lock:  # not self._lock: never wait for a running step, removal unblocks it
            if self._destroyed:
                return
            self._destroyed = True
        with self.events.timed(EventKind.DESTROY, reason=reason):
            try:
                self.backend.remove(self.container_id)
            finally:
                session, self._session = self._session, None
                if session is not None:
                    session.close()
                for driver in (self._browser, self._openenv):
                    if driver is not None:
                        driver.close()
                self._browser = self._openenv = None


def _excerpt(command: str | bytes) -> str:
    text = command if isinstance(command, str) else command.decode(errors="replace")
    return text[:200]
