"""Chromium's DevTools protocol over a pipe (`--remote-debugging-pipe`): no TCP port, no Playwright.

Chromium reads commands on its fd 3 and writes replies and events on its fd 4, each message one JSON
object followed by a NUL byte. One reader thread turns replies into results of the calls that wait
for them and queues events per session; any thread may call.

    browser = Chromium.launch(user_data_dir="/tmp/x")
    target = browser.call("Target.createTarget", url="about:blank")
    ...
    browser.close()

Standard library only: this module runs inside the sandbox (Debian's python3) and is imported on the
host by tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections import deque
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# What every launch needs here: no GPU, no zygote sandbox (the container is the sandbox: no user
# namespaces, every capability dropped), nothing that reaches for the network (closed: each attempt
# is a refused connection), and timers that keep running in contexts that are not in front.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-extensions", "--disable-default-apps", "--mute-audio",
    "--disable-client-side-phishing-detection", "--disable-domain-reliability", "--disable-breakpad",
    "--disable-renderer-backgrounding", "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows", "--disable-ipc-flooding-protection",
    "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication,"
    "CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions,CalculateNativeWinOcclusion",
    "--password-store=basic", "--use-mock-keychain", "--hide-scrollbars", "--font-render-hinting=none",
    "--remote-debugging-pipe",
)
# Chromium reads only the last --disable-features switch: every launch passes one list.
DISABLED_FEATURES = (
    "Translate", "MediaRouter", "OptimizationHints", "AutofillServerCommunication",
    "CertificateTransparencyComponentUpdater", "InterestFeedContentSuggestions", "CalculateNativeWinOcclusion",
)


class CdpError(RuntimeError):
    """A command failed: Chromium answered with an error (`code` set) or is gone (`code` None)."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class Chromium:
    """A running Chromium and the pipe to it."""

    def __init__(self, process: subprocess.Popen[bytes], write_fd: int, read_fd: int) -> None:
        self.process = process
        self._write_fd = write_fd
        self._read_fd = read_fd
        self._write_lock = threading.Lock()
        self._next_id = 0
        self._id_lock = threading.Lock()
        self._waiting: dict[int, list[Any]] = {}  # id -> [event, reply]
        self._events: dict[str, deque[dict[str, Any]]] = {}
        self._events_lock = threading.Condition()
        self.closed = False
        self.listeners: list[Any] = []
        """Callables(message) run on the reader thread for every event; they must not block."""
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()

    @classmethod
    def launch(cls, *, user_data_dir: str, executable: str = CHROMIUM, extra: tuple[str, ...] = (),
               disable_features: tuple[str, ...] = (), log_path: str = "/dev/null") -> Chromium:
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # The child's fds 3 and 4 must be these pipes; move them above any fd the shell could clobber (bash:
        # dash cannot name an fd above 9).
        high_r = _high_fd(to_chrome_r)
        high_w = _high_fd(from_chrome_w)
        argv = ["/bin/bash", "-c", f'exec "$@" 3<&{high_r} 4>&{high_w} {high_r}<&- {high_w}>&-', "sh",
                executable, *FLAGS, f"--user-data-dir={user_data_dir}",
                "--disable-features=" + ",".join((*DISABLED_FEATURES, *disable_features)), *extra, "about:blank"]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       pass_fds=(high_r, high_w), start_new_session=True)
        for fd in (to_chrome_r, from_chrome_w, high_r, high_w):
            os.close(fd)
        browser = cls(process, to_chrome_w, from_chrome_r)
        browser.call("Browser.getVersion", timeout=30)
        return browser

    # -- calls ------------------------------------------------------------------------------------
    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None) -> int:
        """Send without waiting; returns the message id (see wait)."""
        with self._id_lock:
            self._next_id += 1
            message_id = self._next_id
            self._waiting[message_id] = [threading.Event(), None]
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message, separators=(",", ":")).encode() + b"\0"
        with self._write_lock:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._write_fd, view):]
            except OSError as error:
                self._waiting.pop(message_id, None)
                raise CdpError(f"{method}: the browser is gone ({error})") from None
        return message_id

    def wait(self, message_id: int, *, method: str = "", timeout: float = 10.0) -> dict[str, Any]:
        slot = self._waiting.get(message_id)
        if slot is None:
            raise CdpError(f"{method}: no such call {message_id}")
        if not slot[0].wait(timeout):
            self._waiting.pop(message_id, None)
            raise CdpError(f"{method}: no answer in {timeout:g} s" + ("" if self.alive() else " (the browser exited)"))
        self._waiting.pop(message_id, None)
        reply = slot[1]
        if reply is None:
            raise CdpError(f"{method}: the browser is gone")
        if "error" in reply:
            error = reply["error"]
            raise CdpError(f"{method}: {error.get('message', error)}", code=error.get("code", 0))
        return reply.get("result", {})

    def call(self, method: str, *, session: str | None = None, timeout: float = 10.0, **params: Any) -> dict[str, Any]:
        return self.wait(self.send(method, params, session=session), method=method, timeout=timeout)

    # -- events -----------------------------------------------------------------------------------
    def drain(self, session: str) -> list[dict[str, Any]]:
        """Every event queued for `session` since the last drain."""
        with self._events_lock:
            queue = self._events.get(session)
            if not queue:
                return []
            events = list(queue)
            queue.clear()
            return events

    def wait_event(self, session: str, methods: set[str], *, timeout: float,
                   match: Any = None) -> dict[str, Any] | None:
        """The first queued event of `session` named in `methods` (and accepted by `match`), waiting
        up to `timeout`; earlier other events are dropped. None on timeout."""
        deadline = time.monotonic() + timeout
        with self._events_lock:
            while True:
                queue = self._events.setdefault(session, deque(maxlen=4096))
                while queue:
                    event = queue.popleft()
                    if event.get("method") in methods and (match is None or match(event)):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closed:
                    return None
                self._events_lock.wait(remaining)

    def forget(self, session: str) -> None:
        with self._events_lock:
            self._events.pop(session, None)

    # -- lifecycle --------------------------------------------------------------------------------
    def alive(self) -> bool:
        return not self.closed and self.process.poll() is None

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(CdpError):
                self.call("Browser.close", timeout=2)
            try:
                self.process.wait(2)
            except subprocess.TimeoutExpired:
                _kill_group(self.process)
        for fd in (self._write_fd,):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.closed = True

    def kill(self) -> None:
        _kill_group(self.process)
        self.closed = True

    def _read_loop(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = os.read(self._read_fd, 1 << 20)
                if not chunk:
                    break
                buffer += chunk
                while True:
                    end = buffer.find(b"\0")
                    if end < 0:
                        break
                    raw, buffer = buffer[:end], buffer[end + 1:]
                    self._dispatch(json.loads(raw))
        except (OSError, ValueError):
            pass
        finally:
            self.closed = True
            for slot in list(self._waiting.values()):
                slot[0].set()
            with self._events_lock:
                self._events_lock.notify_all()
            with contextlib.suppress(OSError):
                os.close(self._read_fd)

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            slot = self._waiting.get(message["id"])
            if slot is not None:
                slot[1] = message
                slot[0].set()
            return
        for listener in self.listeners:
            listener(message)
        session = message.get("sessionId", "")
        with self._events_lock:
            self._events.setdefault(session, deque(maxlen=4096)).append(message)
            self._events_lock.notify_all()


def _high_fd(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, 64)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)
