"""An agent program's episode: the program runs inside the sandbox as the agent (environments/agent_program/
sandbox/bridge.py, started over a control exec), its model calls come up the bridge's stream to this episode's
gateway (gateway.py), and the episode ends when the program exits or its budget is spent.

    trajectory = run_program(ctx, program=config, instruction=text)

The budget: `max_calls` model calls (the next is refused and the program stopped: `max_turns`), and
`timeout_s` of the program's own time — wall-clock time less what its calls waited on the gateway, as the
tool loop's budget leaves the policy's time out (`episode_timeout`). A call past the context window ends it
`context_exhausted`. A program that exits by itself ends `program_exited`, its exit status stored, whatever
it is: a crash is the agent's outcome, graded like any other. The bridge kills every process of the agent
when it ends, so nothing the program started outlives the episode. A bridge that dies or goes silent is the
machine's fault (SandboxFault, retried).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import environments.agent_program
from core.schemas.episode import ProgramRecord
from core.termination import TerminationReason
from environments.agent_program.config import ProgramConfig
from sandboxes.layout import sandbox_env
from sandboxes.spec import SandboxSpec
from sandboxes.stream import ExecStream, StreamClosed, StreamTimeout
from task_workers.episode.errors import SandboxFault
from task_workers.episode.gateway import Gateway
from task_workers.episode.loop import LoopContext
from task_workers.episode.trajectory import Trajectory

logger = logging.getLogger(__name__)
START_S = 60.0
"""How long the bridge may take to start the program."""
STOP_S = 30.0
"""How long the bridge may take to kill the program and report, once told to stop."""
LINE_SLACK = 1 << 20
"""A request's line is its body JSON-escaped (at most 6 bytes a byte: a control character as \\u00XX) and this."""
STOPPED = {TerminationReason.MAX_TURNS: "max_calls", TerminationReason.CONTEXT_EXHAUSTED: "context",
           TerminationReason.EPISODE_TIMEOUT: "timeout"}
"""Why the platform stopped the program (episodes.program.stopped), by the episode's ending."""
GATEWAY_KEY = "crucible-gateway"
"""The API key the program is given: the gateway asks for none (OpenAI clients insist on one)."""


def bridge_source() -> str:
    return (Path(environments.agent_program.__file__).parent / "sandbox" / "bridge.py").read_text()


def program_env(spec: SandboxSpec, program: ProgramConfig) -> dict[str, str]:
    """The program's environment: the sandbox's, the program's own settings, and the gateway's address on the
    sandbox's loopback (`{port}`: the bridge's, filled in by it)."""
    gateway = "http://127.0.0.1:{port}/v1"
    return {**sandbox_env(spec), **program.env, "OPENAI_BASE_URL": gateway, "OPENAI_API_BASE": gateway,
            "OPENAI_API_KEY": GATEWAY_KEY}


def run_program(ctx: LoopContext, *, program: ProgramConfig, instruction: str) -> Trajectory:
    gateway = Gateway(ctx, max_calls=program.max_calls, action_regex=program.action_regex)
    trajectory = gateway.trajectory
    spec: SandboxSpec = ctx.sandbox.spec  # type: ignore[attr-defined]  # every sandbox of a worker has one
    stream = ctx.sandbox.open_control(["/usr/bin/python3", "-I", "-c", bridge_source()])
    started = time.monotonic()
    try:
        _send(stream, {"op": "start", "argv": program.argv(instruction), "env": program_env(spec, program),
                       "cwd": spec.workdir, "user": spec.user, "max_request_bytes": program.max_request_bytes})
        _expect(stream, "started", deadline=time.monotonic() + START_S)
        exited = _serve(stream, gateway, program)
    finally:
        stream.close()
        trajectory.timings["sandbox"] += time.monotonic() - started - gateway.waited_s
    trajectory.termination = gateway.ended or TerminationReason.PROGRAM_EXITED
    trajectory.submitted = gateway.ended is None and exited.get("status") == 0
    trajectory.program = ProgramRecord(
        exit_status=exited.get("status"), stopped=STOPPED.get(gateway.ended) if gateway.ended else None,
        calls=len(trajectory.turns), refused=gateway.refused, segments=gateway.segments,
        output=str(exited.get("output", ""))[-65536:]).stored()
    return trajectory


def _serve(stream: ExecStream, gateway: Gateway, program: ProgramConfig) -> dict:
    """Answer the program's calls until it exits, stopping it once the gateway ends the episode (its budget of
    calls or context spent) or its own time runs out; its exit event. Once stopping, a call still in flight
    is refused by the gateway, unsampled."""
    began = time.monotonic()
    while True:
        stopping = gateway.ended is not None
        own = time.monotonic() - began - gateway.waited_s  # the program's own time so far
        deadline = time.monotonic() + (STOP_S if stopping else program.timeout_s - own)
        try:
            event = _read(stream, deadline=deadline, max_line=6 * program.max_request_bytes + LINE_SLACK)
        except StreamTimeout:
            if stopping:
                raise SandboxFault(f"the agent program's bridge did not stop the program within {STOP_S:g} s") from None
            gateway.ended = TerminationReason.EPISODE_TIMEOUT
            _send(stream, {"op": "stop"})
            continue
        if event.get("event") == "exit":
            return event
        if event.get("event") != "request":
            raise SandboxFault(f"the agent program's bridge: expected a request or its exit, got {str(event)[:200]}")
        status, body = gateway.handle(str(event.get("method")), str(event.get("path")), str(event.get("body", "")))
        _send(stream, {"op": "reply", "id": event.get("id"), "status": status, "body": body})
        if not stopping and gateway.ended is not None:
            _send(stream, {"op": "stop"})


def _send(stream: ExecStream, message: dict) -> None:
    try:
        stream.send(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    except StreamClosed as error:
        raise SandboxFault(f"the agent program's bridge went away: {error}; it said: {_said(stream)}") from None


def _read(stream: ExecStream, *, deadline: float, max_line: int = LINE_SLACK) -> dict:
    try:
        end = stream.read_until(b"\n", deadline=deadline)
    except StreamClosed as error:
        raise SandboxFault(f"the agent program's bridge went away: {error}; it said: {_said(stream)}") from None
    if end > max_line:
        raise SandboxFault(f"the agent program's bridge: expected a line under {max_line} bytes, got {end}")
    line = stream.take(end)
    try:
        event = json.loads(line)
    except ValueError:
        raise SandboxFault(f"the agent program's bridge: expected a JSON line, got {line[:200]!r}") from None
    if not isinstance(event, dict):
        raise SandboxFault(f"the agent program's bridge: expected a JSON object, got {line[:200]!r}")
    return event


def _expect(stream: ExecStream, name: str, *, deadline: float) -> dict:
    try:
        event = _read(stream, deadline=deadline)
    except StreamTimeout:
        raise SandboxFault(f"the agent program's bridge did not start the program within {START_S:g} s; it said: "
                           f"{_said(stream)}") from None
    if event.get("event") != name:
        raise SandboxFault(f"the agent program's bridge: expected {name}, got {str(event)[:300]}")
    return event


def _said(stream: ExecStream) -> str:
    return stream.stderr.decode(errors="replace").strip()[-800:] or "nothing"
