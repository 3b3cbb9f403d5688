"""OpenEnvSession: the worker's end of an openenv sandbox's bridge (environments/openenv/sandbox/bridge.py).

The bridge is started with `docker exec` as the keeper uid from the image's read-only copy, with a clean
environment, as the browser driver is (sandboxes/browser.py: the same JSON-lines channel over the exec's
attached stream, read with deadlines). It runs the environment's OpenEnv server on the sandbox's loopback
and keeps one WebSocket session on it per episode.

    session = sandbox.openenv(app="echo_env.server.app:app", app_dir="/opt/openenv", env={})
    opened = session.call("reset", seed=3, options={})      # {"observation": {...}, "reward", "done"}
    after = session.call("step", action={"message": "hi"})

A reply with `error` (an action the environment refuses): ActionRefused, the agent's. A reply with `fault`,
a bridge that died or went silent: OpenEnvFault, a SandboxError (the episode is retried, the sandbox retired).
"""

from __future__ import annotations

from typing import Any

from sandboxes.browser import BrowserSession
from sandboxes.errors import SandboxError
from sandboxes.layout import KEEPER_DIR, privileged_argv

BRIDGE = "/opt/crucible/openenv/bridge.py"
DEADLINES = {"hello": 150.0, "restart": 150.0, "reset": 90.0, "step": 90.0, "state": 60.0, "quit": 15.0}
"""Each longer than the bridge's own waits for the op (START_DEADLINE_S, CONNECT_DEADLINE_S + RECV_DEADLINE_S),
so the bridge answers, fault or not, before the worker gives up on it."""


class OpenEnvFault(SandboxError):
    """The environment's server or the bridge failed (the machine's fault, not the agent's)."""


class OpenEnvSession(BrowserSession):
    """A fault of any call ends the bridge (its stream closed; the bridge then stops its server), so the next
    use starts both anew rather than talk to a server in an unknown state."""

    what = "openenv bridge"
    fault = OpenEnvFault
    deadlines = DEADLINES

    episodes = 0
    """Episodes reset on this bridge's server (the kind counts them: `server: per_episode` restarts it)."""

    def _call_locked(self, op: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            return super()._call_locked(op, params)
        except OpenEnvFault:
            if self._stream is not None:
                self._kill(self._stream)
            raise

    def argv(self) -> list[str]:
        return privileged_argv([f"HOME={KEEPER_DIR}/home", f"TMPDIR={KEEPER_DIR}/tmp",
                                f"CRUCIBLE_KEEPER_DIR={KEEPER_DIR}", "/usr/bin/python3", "-I", BRIDGE])
