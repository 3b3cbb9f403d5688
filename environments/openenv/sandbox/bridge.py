r"""The OpenEnv bridge inside an openenv sandbox: the environment's server on loopback, and a JSON-lines channel.

The worker starts it with `docker exec` as the keeper uid (as it starts the browser driver) and talks to it
over the exec's attached stdin/stdout. The bridge starts the environment's own OpenEnv server (its ASGI
app under uvicorn) on the sandbox's loopback (the sandbox has no network) and speaks OpenEnv's WebSocket
protocol to it (`/ws`: reset, step, state), one WebSocket session per episode, so each episode meets a
new instance of the environment. Standard library plus `websockets`, which openenv-core brings.

    host -> bridge   {"id": 1, "op": "hello", "app": "echo_env.server.app:app", "app_dir": "/opt/openenv",
                      "env": {...}}\n
    bridge -> host   {"id": 1, "ok": true, "schema": {"action": {...}, "observation": {...}, ...}}\n
    host -> bridge   {"id": 2, "op": "reset", "seed": 3, "episode_id": "e1", "options": {}}\n
    bridge -> host   {"id": 2, "ok": true, "observation": {...}, "reward": null, "done": false}\n
    host -> bridge   {"id": 3, "op": "step", "action": {"message": "hi"}}\n
    bridge -> host   {"id": 3, "ok": false, "error": "..."}\n   (the environment refused the action)
                     {"id": 3, "ok": false, "fault": "..."}\n   (the server died or went silent)

Ops: hello (start the server, wait for /health, read /schema), restart (a new server process), reset, step,
state, quit. The server lives in its own process group, which the bridge kills when it exits however it
exits (stdin closed, quit, a signal): no server outlives its bridge to hold the port against the next one.
Each wait is shorter than the worker's deadline for the op (sandboxes/openenv.py), so the bridge answers
before the worker gives up on it.

Errors. The environment's answer to the agent's action (VALIDATION_ERROR: the action does not fit its
schema; EXECUTION_ERROR: its step raised) is `error`, the agent's to see. Every other error code (capacity,
the factory, the session) and anything unreadable is a `fault`: the machine's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

PORT = 8765
START_DEADLINE_S = 120.0
CONNECT_DEADLINE_S = 20.0
RECV_DEADLINE_S = {"reset": 45.0, "step": 60.0, "state": 20.0}
MAX_FRAME = 16 << 20
AGENTS_ERRORS = ("VALIDATION_ERROR", "EXECUTION_ERROR")
LOG = os.path.join(os.environ.get("CRUCIBLE_KEEPER_DIR", "/tmp"), "openenv-server.log")


class Fault(Exception):
    """The server's fault (it died, went silent, answered nonsense): the machine's, not the agent's."""


class Refused(Exception):
    """The environment answered with an error (an action it does not take, options it refuses)."""


class Bridge:
    def __init__(self) -> None:
        self.server: subprocess.Popen[bytes] | None = None
        self.params: tuple[str, str, dict[str, str]] = ("", "/", {})
        self.ws: Any = None

    # -- the server -------------------------------------------------------------------------------
    def hello(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.server is None:
            self.params = (str(request["app"]), str(request.get("app_dir") or "/"), dict(request.get("env") or {}))
            self._start(*self.params)
        return {"schema": self._get("/schema"), "pid": self._alive().pid}

    def restart(self, request: dict[str, Any]) -> dict[str, Any]:
        """A new server process (the spec's `server: per_episode`): nothing of an earlier episode survives."""
        self._close_session()
        self._stop_server()
        self._start(*self.params)
        return {"pid": self._alive().pid}

    def _start(self, app: str, app_dir: str, extra: dict[str, str]) -> None:
        gone = time.monotonic() + 10.0  # the last bridge's server, stopping as that bridge quits
        while self._answers():  # a server answering is none of ours (ours die with their bridge)
            if time.monotonic() > gone:
                raise Fault(f"port {PORT} is taken by a server this bridge did not start")
            time.sleep(0.2)
        home = os.environ.get("HOME", "/tmp")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": home,
               "TMPDIR": os.environ.get("TMPDIR", "/tmp"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "HF_HOME": os.path.join(home, ".cache", "huggingface"), "PYTHONDONTWRITEBYTECODE": "1",
               **{str(k): str(v) for k, v in extra.items()}}
        log = open(LOG, "ab")  # noqa: SIM115 (the server's stdout and stderr for its life; the child keeps it)
        self.server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(PORT), "--app-dir", app_dir,
             "--log-level", "warning", "--ws", "websockets"],
            cwd=app_dir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise Fault(f"the environment's server exited with {self.server.returncode}: {_log_tail()}")
            try:
                self._get("/health", timeout=2.0)
            except Fault:
                time.sleep(0.2)
                continue
            self._alive()  # the answer was our server's, not one that outlived another bridge
            return
        raise Fault(f"the environment's server did not answer /health within {START_DEADLINE_S:g} s: {_log_tail()}")

    def _answers(self) -> bool:
        try:
            self._get("/health", timeout=1.0)
        except Fault:
            return False
        return True

    def _stop_server(self) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(5)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(5)

    def _get(self, path: str, *, timeout: float = RECV_DEADLINE_S["state"]) -> Any:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout) as response:
                return json.loads(response.read(MAX_FRAME))
        except (OSError, ValueError) as error:
            raise Fault(f"GET {path}: {error}") from None

    # -- the session ------------------------------------------------------------------------------
    def reset(self, request: dict[str, Any]) -> dict[str, Any]:
        from websockets.sync.client import connect

        self._close_session()
        self._alive()
        try:
            self.ws = connect(f"ws://127.0.0.1:{PORT}/ws", max_size=MAX_FRAME, open_timeout=CONNECT_DEADLINE_S)
        except Exception as error:
            raise Fault(f"could not open a session on the environment's server: {error}") from None
        data = dict(request.get("options") or {})
        for key in ("seed", "episode_id"):
            if request.get(key) is not None:
                data[key] = request[key]
        return self._exchange("reset", {"type": "reset", "data": data})

    def step(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._exchange("step", {"type": "step", "data": request.get("action")})

    def state(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = self._send("state", {"type": "state"})
        if reply.get("type") != "state":
            raise Fault(f"expected a state reply, got {str(reply)[:300]}")
        return {"state": reply.get("data")}

    def _exchange(self, op: str, message: dict[str, Any]) -> dict[str, Any]:
        reply = self._send(op, message)
        if reply.get("type") == "error":
            data: dict[str, Any] = reply["data"] if isinstance(reply.get("data"), dict) else {}
            text = str(data.get("message") or data)[:4000]
            if data.get("code") in AGENTS_ERRORS:
                raise Refused(text)
            raise Fault(f"the environment's server answered {op} with {data.get('code')}: {text}")
        if reply.get("type") != "observation" or not isinstance(reply.get("data"), dict):
            raise Fault(f"expected an observation, got {str(reply)[:300]}")
        data = reply["data"]
        return {"observation": data.get("observation") or {}, "reward": data.get("reward"),
                "done": bool(data.get("done"))}

    def _send(self, op: str, message: dict[str, Any]) -> dict[str, Any]:
        if self.ws is None:
            raise Fault("expected a reset before this call, got none")
        try:
            self.ws.send(json.dumps(message))
            raw = self.ws.recv(timeout=RECV_DEADLINE_S[op])
        except Exception as error:
            self._alive()
            raise Fault(f"the environment's session failed: {error}") from None
        try:
            reply = json.loads(raw)
        except ValueError:
            raise Fault(f"expected a JSON reply, got {str(raw)[:200]}") from None
        if not isinstance(reply, dict):
            raise Fault(f"expected a JSON object, got {str(raw)[:200]}")
        return reply

    def _alive(self) -> subprocess.Popen[bytes]:
        if self.server is None:
            raise Fault("the environment's server was never started (hello first)")
        if self.server.poll() is not None:
            raise Fault(f"the environment's server exited with {self.server.returncode}: {_log_tail()}")
        return self.server

    def _close_session(self) -> None:
        if self.ws is not None:
            try:
                self.ws.send(json.dumps({"type": "close"}))
                self.ws.close()
            except Exception:
                pass
            self.ws = None

    def quit(self, request: dict[str, Any]) -> dict[str, Any]:
        self._close_session()
        self._stop_server()
        return {}


def _log_tail() -> str:
    try:
        with open(LOG, "rb") as handle:
            handle.seek(max(0, os.path.getsize(LOG) - 1500))
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return "(no log)"


def main() -> None:
    bridge = Bridge()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that `finally` stops the server
    try:
        serve(bridge)
    finally:
        bridge._close_session()
        bridge._stop_server()


def serve(bridge: Bridge) -> None:
    ops = {"hello": bridge.hello, "restart": bridge.restart, "reset": bridge.reset, "step": bridge.step,
           "state": bridge.state, "quit": bridge.quit}
    out = sys.stdout
    for line in sys.stdin:
        try:
            request = json.loads(line)
            rid, op = request.get("id"), request.get("op")
        except (ValueError, AttributeError):
            out.write(json.dumps({"id": None, "ok": False, "fault": "expected a JSON object per line"}) + "\n")
            out.flush()
            continue
        try:
            if op not in ops:
                raise Refused(f"op: expected one of {', '.join(ops)}, got {op!r}")
            reply = {"id": rid, "ok": True, **ops[op](request)}
        except Refused as refused:
            reply = {"id": rid, "ok": False, "error": str(refused)}
        except Fault as fault:
            reply = {"id": rid, "ok": False, "fault": str(fault)}
        except Exception as error:
            reply = {"id": rid, "ok": False, "fault": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(reply, separators=(",", ":"), default=str) + "\n")
        out.flush()
        if op == "quit":
            return


if __name__ == "__main__":
    main()
