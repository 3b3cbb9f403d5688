"""BrowserSession: the worker's end of a browser sandbox's driver (environments/browser/sandbox/browserd.py).

The driver is started with `docker exec` as the keeper uid (not the agent's, so the pool's reset,
which kills the agent's processes, leaves Chromium up across episodes) from the image's read-only
copy, with a clean environment; it speaks JSON lines over the exec's attached stdin/stdout, read
here with deadlines (stream.ExecStream). Nothing of it listens on a port.

    session = sandbox.browser()                     # started on first use, kept for the sandbox's life
    page = session.call("open", task={...})         # dict: url, tree, goal, ...
    page = session.call("act", action="click", args={"bid": "12"})

A reply with `error` is the agent's (a wrong action, an unknown task page): ActionRefused. A reply
with `fault`, a driver that died or did not answer in time: BrowserFault, a SandboxError (the episode
is retried and the sandbox retired).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from sandboxes.errors import ActionRefused, SandboxError
from sandboxes.layout import KEEPER_DIR, privileged_argv
from sandboxes.stream import ExecStream, StreamClosed, StreamTimeout

DRIVER = "/opt/crucible/browser/browserd.py"
MINIWOB_DIR = "/opt/crucible/miniwob"
MAX_REPLY = 64 << 20
log = logging.getLogger(__name__)
DEADLINES = {"hello": 60.0, "open": 60.0, "relaunch": 90.0, "act": 45.0, "observe": 30.0, "state": 15.0,
             "eval": 30.0, "quit": 10.0}


class BrowserFault(SandboxError):
    """The browser or its driver failed (the machine's fault, not the agent's)."""


def driver_argv() -> list[str]:
    return privileged_argv([
        f"HOME={KEEPER_DIR}/home", f"TMPDIR={KEEPER_DIR}/tmp", f"XDG_CONFIG_HOME={KEEPER_DIR}/home/.config",
        f"XDG_CACHE_HOME={KEEPER_DIR}/home/.cache", f"CRUCIBLE_MINIWOB_DIR={MINIWOB_DIR}", f"CRUCIBLE_KEEPER_DIR={KEEPER_DIR}",
        "/usr/bin/python3", "-I", DRIVER,
    ])


class BrowserSession:
    """One driver process; calls are serialised. A JSON-lines driver of another kind (the OpenEnv bridge,
    sandboxes/openenv.py) subclasses it with its own argv, deadlines, fault and name."""

    what = "browser driver"
    fault: type[SandboxError] = BrowserFault
    deadlines = DEADLINES

    def argv(self) -> list[str]:
        return driver_argv()

    def __init__(self, open_stream: Callable[[list[str]], ExecStream], *, hello: dict[str, Any] | None = None) -> None:
        self._open_stream = open_stream
        self.hello = dict(hello or {})
        """What `hello` sends at start (the OpenEnv bridge's app and environment; nothing for the browser):
        a sandbox asked for a driver with other settings starts a new one (Sandbox._driver)."""
        self._stream: ExecStream | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self.info: dict[str, Any] = {}

    @property
    def alive(self) -> bool:
        return self._stream is not None and not self._stream.eof

    def start(self) -> dict[str, Any]:
        with self._lock:
            if self._stream is None:
                self._stream = self._open_stream(self.argv())
            try:
                self.info = self._call_locked("hello", self.hello)
            except self.fault as fault:
                if self._stream is None:  # the driver died or went silent: nothing to ask again
                    raise
                # The driver answered with a fault: its Chromium did not answer in time (on a loaded
                # machine one took over 30 s to start). Asked once more; a second fault is final.
                log.warning("%s: %s; asking it once more", self.what, fault)
                self.info = self._call_locked("hello", self.hello)
            return self.info

    def call(self, op: str, **params: Any) -> dict[str, Any]:
        with self._lock:
            if self._stream is None:
                raise self.fault(f"the {self.what} is not running")
            return self._call_locked(op, params)

    def _call_locked(self, op: str, params: dict[str, Any]) -> dict[str, Any]:
        import time

        stream = self._stream
        assert stream is not None
        self._next_id += 1
        request = {"id": self._next_id, "op": op, **params}
        try:
            stream.send(json.dumps(request, separators=(",", ":")).encode() + b"\n")
            end = stream.read_until(b"\n", deadline=time.monotonic() + self.deadlines.get(op, 30.0))
            line = stream.take(end)
        except (StreamClosed, StreamTimeout) as error:
            self._kill(stream)
            detail = stream.stderr.decode(errors="replace").strip()[-800:]
            raise self.fault(f"{self.what} ({op}): {error}" + (f"; it said: {detail}" if detail else "")) from None
        if len(line) > MAX_REPLY:
            self._kill(stream)
            raise self.fault(f"{self.what} ({op}): expected a reply under {MAX_REPLY} bytes, got {len(line)}")
        try:
            reply = json.loads(line)
        except ValueError:
            self._kill(stream)
            raise self.fault(f"{self.what} ({op}): expected a JSON reply, got {line[:200]!r}") from None
        if not isinstance(reply, dict) or reply.get("id") != self._next_id:
            self._kill(stream)
            raise self.fault(f"{self.what} ({op}): expected the reply to request {self._next_id}, got {str(reply)[:200]}")
        if reply.get("fault"):
            raise self.fault(f"{self.what.removesuffix(' driver')} ({op}): {reply['fault']}")
        if not reply.get("ok"):
            raise ActionRefused(str(reply.get("error", "refused")))
        return reply

    def _kill(self, stream: ExecStream) -> None:
        stream.close()
        self._stream = None

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is None:
            return
        try:
            if not stream.eof:
                import time

                stream.send(b'{"id":0,"op":"quit"}\n')
                stream.read_until(b"\n", deadline=time.monotonic() + 5)
        except (StreamClosed, StreamTimeout, SandboxError):
            pass
        finally:
            stream.close()
