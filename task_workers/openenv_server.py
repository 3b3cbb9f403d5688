"""Crucible's environments served to OpenEnv clients: `crucible env serve ENV --openenv --port P`.

OpenEnv (PyPI `openenv-core`) is the field's environment interface: TRL, SkyRL, ART and verifiers drive
an environment through its client, one WebSocket session per environment instance. This server speaks
that protocol at `/ws` for any registered environment whose reward is its own verifier's (code_repo with
its hidden tests, browser, read_number):

    → {"type": "reset", "data": {"seed": 3, "episode_id": "e1", "task_id": "calc-1"}}   (each optional)
    ← {"type": "observation", "data": {"observation": {"text": …, "tools": […], "task_id": …},
                                       "reward": null, "done": false}}
    → {"type": "step", "data": {"tool": "bash", "arguments": {"command": "pytest -q"}}}
    ← {"type": "observation", "data": {"observation": {"text": …, "status": "ok", "exit_code": 0}, …}}
    → {"type": "step", "data": {"tool": "submit", "arguments": {}}}
    ← {"type": "observation", "data": {"observation": {"text": …, "termination": "submitted",
                                       "reward_components": {…}}, "reward": 0.3, "done": true}}
    → {"type": "state"}   ← {"type": "state", "data": {"episode_id", "task_id", "step_count", "done"}}
    → {"type": "close"}
    ← {"type": "error", "data": {"message": …, "code": …}} for anything refused

Each session leases a sandbox from the warm pool at `reset` and gives it back when the episode ends, at
the next reset, on close, and when the connection drops. The episode ends as the agent loop ends one
(task_workers.episode.loop): a call that ends it (submit), the turn limit, the tool-error limit, the
episode's time limit. Its reward is the kind's verifier's, exactly as a training episode's (code_repo:
the hidden tests in a fresh sandbox); an observation carries the reward and each layer's score, never a
layer's detail, so hidden test names and output stay out of the client's reach. Environments whose
verifier asks a judge or a reward model are not served (their layers would need a policy transcript).

`reset` picks the task: `task_id` (the task's external id), else `seed` (the task at seed mod n of the
split, in id order), else the next in turn. The server binds loopback only: a session is a shell in a
sandbox, and the protocol has no authentication.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from sqlalchemy import select

from core.errors import ConfigError, CrucibleError
from core.models import Task
from core.termination import TerminationReason
from environments.base import EnvironmentKind, ToolCall, ToolResult, ToolStatus
from environments.openenv.kind import OpenEnvKind
from environments.registry import get_kind, kind_names
from environments.rewards import total
from environments.sandboxes import DockerSandboxes
from environments.service import get_environment, spec_of
from environments.spec import EnvironmentSpec
from task_workers.episode.driver import EpisodeDriver
from task_workers.episode.errors import InfrastructureFault
from task_workers.episode.loop import cap_text, episode_end

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 1_000_000
"""The largest client message read (a file an agent writes fits; a flood does not)."""
MAX_TASK_ID_CHARS = 512
IDLE_TIMEOUT_S = 300.0
"""How long a session may stay silent before it is closed (its sandbox back in the pool)."""


class ProtocolError(Exception):
    """A message the session refuses: answered as an OpenEnv error, the connection kept."""

    def __init__(self, message: str, *, code: str = "invalid_message") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ServedTask:
    external_id: str
    instruction: str
    payload: dict[str, Any]


@dataclass
class Served:
    """The environment a server serves: its spec, kind and the tasks of one split (read at start)."""

    name: str
    version: int
    spec: EnvironmentSpec
    split: str
    tasks: list[ServedTask]
    _turn: itertools.count = field(default_factory=itertools.count)

    @property
    def kind(self) -> EnvironmentKind:
        return get_kind(self.spec.kind)(self.spec)

    def pick(self, *, task_id: Any, seed: Any) -> ServedTask:
        if task_id is not None:
            if not isinstance(task_id, str) or not 0 < len(task_id) <= MAX_TASK_ID_CHARS:
                raise ProtocolError(f"reset.task_id: expected a task id (1 to {MAX_TASK_ID_CHARS} characters), "
                                    f"got {str(task_id)[:80]!r}")
            for task in self.tasks:
                if task.external_id == task_id:
                    return task
            raise ProtocolError(f"reset.task_id: no task {task_id[:80]!r} in split {self.split!r} of {self.name}",
                                code="unknown_task")
        if seed is not None:
            if type(seed) is not int:
                raise ProtocolError(f"reset.seed: expected an integer, got {str(seed)[:80]!r}")
            return self.tasks[seed % len(self.tasks)]
        return self.tasks[next(self._turn) % len(self.tasks)]


def load_served(session: Any, *, name: str, split: str, version: int | None = None) -> Served:
    """ConfigError unless `name` is an environment this server can serve with tasks in `split`."""
    row = get_environment(session, name=name, version=version)
    spec = spec_of(row)
    if spec.verifier.judge is not None or spec.verifier.reward_model is not None:
        raise ConfigError(f"environment {name!r}: its verifier asks a judge or a reward model, which score a "
                          "policy's transcript; serving it over OpenEnv is not supported (expected a verifier "
                          "of its own layers only)")
    if spec.kind == OpenEnvKind.name:
        others = ", ".join(kind for kind in kind_names() if kind != OpenEnvKind.name)
        raise ConfigError(f"environment {name!r} is itself an OpenEnv environment: expected a Crucible kind to serve "
                          f"({others}); its own image already serves OpenEnv")
    rows = session.execute(select(Task.external_id, Task.instruction, Task.payload)
                           .where(Task.environment_name == name, Task.split == split).order_by(Task.id)).all()
    if not rows:
        raise ConfigError(f"--split: environment {name!r} has no task in split {split!r}")
    kind = get_kind(spec.kind)
    for external_id, _, payload in rows:
        try:
            kind.parse_task(payload)
        except ValueError as error:
            raise ConfigError(f"task {external_id!r} of {name!r}: its payload is not a {spec.kind} task: "
                              f"{str(error)[:300]}") from None
    return Served(name=name, version=row.version, spec=spec, split=split,
                  tasks=[ServedTask(external_id, instruction, payload) for external_id, instruction, payload in rows])


class Session:
    """One client's environment instance: at most one episode, and its sandbox, at a time. Its methods
    run one at a time (the connection's handler awaits each), off the event loop."""

    def __init__(self, served: Served, sandboxes: DockerSandboxes) -> None:
        self.served = served
        self.sandboxes = sandboxes
        self.kind = served.kind
        self.tool_names = {tool["function"]["name"] for tool in self.kind.tools()}
        self._stack: ExitStack | None = None
        self.driver: EpisodeDriver | None = None
        """The episode's driver while one is open (task_workers/episode/driver.py, as the Celery runner's)."""
        self.task_id: str | None = None
        self.episode_id: str | None = None
        self.actions: list[ToolCall] = []
        self.tool_errors = 0
        self.deadline = 0.0
        self.done = False

    # -- the protocol's three calls ------------------------------------------------------------------
    def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        self.release()
        episode_id = data.get("episode_id")
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > MAX_TASK_ID_CHARS):
            raise ProtocolError(f"reset.episode_id: expected a string of at most {MAX_TASK_ID_CHARS} characters, "
                                f"got {str(episode_id)[:80]!r}")
        chosen = self.served.pick(task_id=data.get("task_id"), seed=data.get("seed"))
        driver = EpisodeDriver(self.kind, spec=self.served.spec, sandboxes=self.sandboxes, run_id=None, episode_id=None)
        stack = ExitStack()
        try:
            opened = stack.enter_context(driver.open(chosen.payload, instruction=chosen.instruction))
        except InfrastructureFault as error:
            stack.close()
            raise ProtocolError(f"the sandbox could not be set up: {str(error)[:300]}", code="sandbox_error") from None
        except BaseException:
            stack.close()
            raise
        self._stack, self.driver, self.task_id = stack, driver, chosen.external_id
        self.episode_id, self.actions, self.tool_errors, self.done = episode_id, [], 0, False
        self.deadline = time.monotonic() + self.served.spec.limits.episode_timeout_s
        return _observation({"text": opened.text, "tools": self.kind.tools(), "task_id": chosen.external_id})

    def step(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.driver is None:
            raise ProtocolError("step: the episode has ended (or never began): reset first", code="no_episode")
        call = self._call(data)
        if time.monotonic() > self.deadline:  # too late to act: the episode ends as the agent loop ends it
            return self._end(TerminationReason.EPISODE_TIMEOUT, {
                "text": f"the episode's time limit ({self.served.spec.limits.episode_timeout_s:g} s) has passed: "
                        f"{call.name} was not run", "status": "timeout", "exit_code": None})
        try:
            result = self.driver.step(call)
        except CrucibleError as error:
            self.release()
            raise ProtocolError(f"the sandbox failed while running {call.name}: {str(error)[:300]}; reset to play "
                                "again", code="sandbox_error") from None
        if result.status == ToolStatus.SANDBOX_DEAD:
            self.release()
            raise ProtocolError(f"the sandbox died while running {call.name}; reset to play again",
                                code="sandbox_error")
        self.actions.append(call)
        self.tool_errors = self.tool_errors + 1 if result.is_error else 0
        limits = self.served.spec.limits
        observation: dict[str, Any] = {"text": cap_text(result.observation, limits.observation_max_chars),
                                       "status": result.status, "exit_code": result.exit_code}
        reason = self._termination(result)
        if reason is None:
            return _observation(observation)
        return self._end(reason, observation)

    def seconds_left(self) -> float | None:
        """The episode's time left; None between episodes."""
        return None if self.driver is None else max(0.0, self.deadline - time.monotonic())

    def state(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "task_id": self.task_id, "step_count": len(self.actions),
                "done": self.done, "environment": self.served.name, "version": self.served.version}

    def release(self) -> None:
        """Give the sandbox back to its pool (it is reset there before another lease)."""
        stack, self._stack, self.driver = self._stack, None, None
        if stack is not None:
            stack.close()

    # -- internals -----------------------------------------------------------------------------------
    def _call(self, data: dict[str, Any]) -> ToolCall:
        name, arguments = data.get("tool", data.get("name")), data.get("arguments", {})
        if not isinstance(name, str) or name not in self.tool_names:
            raise ProtocolError(f"step.tool: expected one of {', '.join(sorted(self.tool_names))}, got "
                                f"{str(name)[:80]!r}")
        if not isinstance(arguments, dict):
            raise ProtocolError(f"step.arguments: expected an object, got {type(arguments).__name__}")
        extra = set(data) - {"tool", "name", "arguments", "metadata"}
        if extra:
            raise ProtocolError(f"step: expected tool and arguments, got also {', '.join(sorted(extra))[:200]}")
        return ToolCall(name, arguments)

    def _termination(self, result: ToolResult) -> TerminationReason | None:
        """The agent loop's rule (no format errors here: an action is parsed or refused), then the time limit,
        checked after the action too."""
        reason = episode_end(self.served.spec.limits, result=result, turns=len(self.actions), format_errors=0,
                             tool_errors=self.tool_errors)
        if reason is None and time.monotonic() > self.deadline:
            return TerminationReason.EPISODE_TIMEOUT
        return reason

    def _end(self, reason: TerminationReason, observation: dict[str, Any]) -> dict[str, Any]:
        """The verifier's verdict on the episode; the sandbox goes back either way."""
        assert self.driver is not None
        spec = self.driver.spec  # on the task's own image, if it names one
        try:
            verdict = self.driver.verdict(submitted=reason is TerminationReason.SUBMITTED, actions=self.actions)
        except InfrastructureFault as error:
            raise ProtocolError(f"grading failed for a reason of the machine ({str(error)[:200]}); the episode is "
                                "not scored: reset to play again", code="grader_error") from None
        finally:
            self.release()
        self.done = True
        # The layers' scores, never their details (hidden tests) nor the hack monitors' flags (what fired
        # would teach a client how to evade them).
        return _observation({**observation, "termination": reason.value, "reward_components": verdict.components},
                            reward=total(verdict.layers, verdict.flags, spec).value, done=True)


def _observation(observation: dict[str, Any], *, reward: float | None = None, done: bool = False) -> dict[str, Any]:
    return {"observation": observation, "reward": reward, "done": done}


def _error(message: str, code: str) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code}})


def _schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schemas of the action (one of `tools`), the observation and the state, as `/schema` serves them."""
    return {
        "action": {"type": "object", "required": ["tool"], "properties": {
            "tool": {"type": "string", "enum": sorted(tool["function"]["name"] for tool in tools)},
            "arguments": {"type": "object"}}, "tools": tools},
        "observation": {"type": "object", "properties": {
            "text": {"type": "string"}, "tools": {"type": "array"}, "task_id": {"type": "string"},
            "status": {"type": "string"}, "exit_code": {"type": ["integer", "null"]},
            "termination": {"type": "string"}, "reward_components": {"type": "object"}}},
        "state": {"type": "object", "properties": {
            "episode_id": {"type": ["string", "null"]}, "task_id": {"type": ["string", "null"]},
            "step_count": {"type": "integer"}, "done": {"type": "boolean"}}},
    }


def create_app(served: Served, sandboxes: DockerSandboxes, *, max_sessions: int = 8,
               idle_timeout_s: float = IDLE_TIMEOUT_S) -> FastAPI:
    """The OpenEnv server for `served`; its sandboxes come from `sandboxes` (closed by the caller). Each
    session's calls run on a pool of threads of their own (one per session), so that a long command in
    one session never waits for a thread behind another's."""
    app = FastAPI(title=f"Crucible {served.name} (OpenEnv)", docs_url=None, redoc_url=None)
    slots = threading.BoundedSemaphore(max_sessions)
    threads = ThreadPoolExecutor(max_workers=max_sessions, thread_name_prefix="openenv-session")
    app.state.sessions = 0

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "healthy"}

    @app.get("/metadata")
    def metadata() -> dict[str, Any]:
        stats = sandboxes.pool_for(served.spec).stats()
        return {"name": served.name, "version": served.version, "kind": served.spec.kind, "split": served.split,
                "tasks": len(served.tasks), "max_sessions": max_sessions, "sessions": app.state.sessions,
                "sandboxes": {"leased": stats.leased, "idle": stats.idle, "creating": stats.creating,
                              "recycling": stats.recycling}, "server": "crucible"}

    @app.get("/schema")
    def schema() -> dict[str, Any]:
        return _schema(served.kind.tools())

    @app.websocket("/ws")
    async def session_socket(websocket: WebSocket) -> None:
        await websocket.accept()
        if not slots.acquire(blocking=False):
            await websocket.send_text(_error(f"the server holds {max_sessions} sessions, its most; try again later",
                                             "capacity"))
            await websocket.close()
            return
        try:
            app.state.sessions += 1
            session = Session(served, sandboxes)
            try:
                await _serve(websocket, session, threads=threads, idle_timeout_s=idle_timeout_s)
            except WebSocketDisconnect:
                pass
            finally:  # a dropped session's sandbox goes back too
                await asyncio.get_running_loop().run_in_executor(threads, session.release)
        finally:
            app.state.sessions -= 1
            slots.release()

    app.state.threads = threads  # the caller shuts it down after the server stops
    return app


async def _serve(websocket: WebSocket, session: Session, *, threads: ThreadPoolExecutor,
                 idle_timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        left = session.seconds_left()
        wait = idle_timeout_s if left is None else min(idle_timeout_s, left + 5.0)
        try:
            frame = await asyncio.wait_for(websocket.receive(), timeout=wait)
        except TimeoutError:
            await websocket.send_text(_error(f"the session was silent for {wait:.0f} s: closed, its sandbox given "
                                             "back", "idle"))
            await websocket.close()
            return
        if frame["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(frame.get("code", 1000))
        raw = frame.get("text")
        if raw is None:
            await websocket.send_text(_error("message: expected a text frame of JSON, got a binary frame",
                                             "invalid_message"))
            continue
        if len(raw) > MAX_MESSAGE_CHARS:
            await websocket.send_text(_error(f"message: expected at most {MAX_MESSAGE_CHARS} characters, got "
                                             f"{len(raw)}", "too_large"))
            continue
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError) as error:
            await websocket.send_text(_error(f"message: expected JSON, got {str(error)[:120]}", "invalid_json"))
            continue
        kind = message.get("type") if isinstance(message, dict) else None
        data = message.get("data", {}) if isinstance(message, dict) else None
        if kind == "close":
            return
        if not isinstance(data, dict):
            await websocket.send_text(_error(f"message.data: expected an object, got {type(data).__name__}",
                                             "invalid_message"))
            continue
        calls = {"reset": session.reset, "step": session.step}
        try:
            if kind == "state":
                reply = {"type": "state", "data": session.state()}
            elif kind in calls:
                reply = {"type": "observation", "data": await loop.run_in_executor(threads, calls[kind], data)}
            else:
                raise ProtocolError(f"message.type: expected reset, step, state or close, got {str(kind)[:80]!r}",
                                    code="unknown_type")
        except ProtocolError as error:
            await websocket.send_text(_error(str(error), error.code))
            continue
        except Exception as error:  # a fault of ours or of the sandbox layer: the episode is void, the server goes on
            log.exception("openenv session: %s failed", kind)
            await loop.run_in_executor(threads, session.release)
            await websocket.send_text(_error(f"{kind} failed ({type(error).__name__}); the episode is void: reset to "
                                             "play again", "internal_error"))
            continue
        await websocket.send_text(json.dumps(reply))
