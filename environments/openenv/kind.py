"""The openenv environment kind: an OpenEnv environment's own server in the sandbox, its reward as a layer.

    name: echo
    kind: openenv
    image: crucible-openenv/echo:latest      # crucible images openenv echo (environments/openenv/images.py)
    openenv: {app: "echo_env.server.app:app", tool: say, reward: last}
    limits: {max_turns: 3, max_context_tokens: 1024, max_response_tokens: 48}

The sandbox runs the environment's OpenEnv server (uvicorn, on the sandbox's loopback; the sandbox has no
network) and a bridge the worker talks to over the exec's attached stream, as to the browser driver
(sandboxes/openenv.py). Each episode opens its own WebSocket session on the server, so each meets a new
instance of the environment, reset with the task's seed.

The agent has one tool, named by the spec (`act` by default), whose parameters are the environment's action
schema (`GET /schema`, less the `metadata` every OpenEnv action carries). Its observations are the
environment's, fields as `name: value` lines. The episode ends when an observation says `done`, or at a
limit. The `openenv` layer's score is the environment's own `Observation.reward`: that of the last
observation (`reward: last`) or the sum over the steps (`sum`), as the environment gave it, read by the
worker from the server through the bridge (the agent has no shell in this sandbox: its only way in is the
action). The agent never sees a reward in its observations.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from core.renderers import HERMES_CALL
from environments.base import (
    GraderFault,
    Kind,
    LayerResult,
    Opening,
    OpenSandbox,
    Sandbox,
    TaskRefused,
    ToolCall,
    ToolResult,
    ToolStatus,
    Verdict,
    tool_error,
)
from environments.openenv.config import OpenEnvSettings
from environments.openenv.task import OpenEnvTask
from environments.spec import EnvironmentSpec
from sandboxes.errors import ActionRefused, SandboxError

TOOL_SCHEMAS: dict[str, dict[str, Any]] = {}
"""No fixed tools: the one tool's parameters are the environment's action schema (read at setup)."""
SYSTEM_PROMPT = ("You act in an environment through the tool `{tool}`. Each observation shows what the environment "
                 "returned. Call exactly one tool per turn as " + HERMES_CALL.replace("{", "{{").replace("}", "}}") + ".")
HIDDEN_FIELDS = ("reward", "done", "metadata")
MAX_ACTION_BYTES = 64 * 1024
MAX_FIELD_CHARS = 16_000


class OpenEnvKind(Kind):
    name = "openenv"
    default_weights = {"openenv": 1.0}
    config_model = OpenEnvSettings
    example = '{"seed": 3, "options": {}}'

    @classmethod
    def check_spec(cls, spec: EnvironmentSpec) -> None:
        if spec.kind_config is None:
            raise ValueError("openenv: expected a section naming the environment's server (app: module:attribute) "
                             "for kind openenv, got none")

    @staticmethod
    def default_instruction(task: OpenEnvTask) -> str:
        """The environment's first observation follows it."""
        return "Act in the environment." if task.seed is None else f"Act in the environment (instance {task.seed})."

    def __init__(self, spec: EnvironmentSpec) -> None:
        if not isinstance(spec.kind_config, OpenEnvSettings):  # the spec refuses it at registration
            raise GraderFault("openenv: expected the spec's openenv section, got none")
        self.spec = spec
        self.settings = spec.kind_config
        self._session: Any = None
        self._tool: dict[str, Any] | None = None
        """The one tool, made from the environment's action schema at setup (action_tool)."""
        self._opening: dict[str, Any] = {}
        self.rewards: list[float | None] = []
        self.done = False
        self.failed: str | None = None
        self.server_pid: int | None = None

    @staticmethod
    def parse_task(payload: dict[str, Any]) -> OpenEnvTask:
        return OpenEnvTask.model_validate(payload)

    def system_prompt(self) -> str:
        return self.spec.system_prompt or SYSTEM_PROMPT.format(tool=self.settings.tool)

    def tools(self) -> list[dict[str, Any]]:
        if self._tool is None:
            raise GraderFault("openenv: the tools come from the environment's action schema, read at setup; "
                              "expected setup first")
        return [self._tool]

    # -- episode ----------------------------------------------------------------------------------
    def setup(self, *, sandbox: Sandbox, task: OpenEnvTask) -> None:
        """The environment's server (started once per sandbox), then a new session reset with the task's seed."""
        self._session = sandbox.openenv(app=self.settings.app, app_dir=self.settings.app_dir, env=self.settings.env)
        schema = self._session.info.get("schema") or {}
        if not isinstance(schema, dict) or not isinstance(schema.get("action"), dict):
            raise GraderFault(f"openenv: expected /schema to give an action schema, got {str(schema)[:300]}")
        self._tool = action_tool(self.settings.tool, schema["action"])
        self.rewards, self.done, self.failed = [], False, None
        self.server_pid = self._session.info.get("pid")
        if self.settings.server == "per_episode" and self._session.episodes:
            # a new server process: nothing an earlier episode ran in the last one survives
            self.server_pid = self._session.call("restart").get("pid")
        self._session.episodes += 1
        try:
            self._opening = self._session.call("reset", seed=task.seed, options=task.options)
        except ActionRefused as refused:  # the environment will not take the task's options: never playable
            raise TaskRefused(f"the environment refused the reset: {refused}") from None
        self.done = bool(self._opening.get("done"))

    def opening(self, *, sandbox: Sandbox, task: OpenEnvTask, instruction: str) -> Opening:
        text = observation_text(self._opening.get("observation") or {})
        return Opening(text=f"{instruction}\n\n{text}".strip() if instruction else text)

    def execute(self, *, sandbox: Sandbox, call: ToolCall, task: OpenEnvTask) -> ToolResult:
        if call.name != self.settings.tool:
            return tool_error(f"tool: expected {self.settings.tool}, got {json.dumps(call.name)[:100]}")
        offered = set(self.tools()[0]["function"]["parameters"]["properties"])
        unknown = sorted(set(call.arguments) - offered)
        if unknown:
            return tool_error(f"arguments: expected names among {', '.join(sorted(offered)) or 'none'}, got "
                          f"{', '.join(unknown)[:300]}")
        try:
            size = len(json.dumps(call.arguments, allow_nan=False))
        except (TypeError, ValueError) as error:
            return tool_error(f"arguments: expected JSON values, got {error}")
        if size > MAX_ACTION_BYTES:
            return tool_error(f"arguments: expected at most {MAX_ACTION_BYTES} bytes, got {size}")
        try:
            after = self._session.call("step", action=dict(call.arguments))
        except ActionRefused as refused:  # the environment's validation: the agent's mistake
            return tool_error(f"the environment refused the action: {refused}"[:4000])
        except SandboxError as fault:  # the server died or stalled on this action: the episode ends, unpaid
            self.failed = str(fault)[:500]
            return ToolResult(observation="Error: the environment failed on this action; the episode is over.",
                              output=self.failed, status=ToolStatus.ERROR, ends_episode=True)
        self.rewards.append(reward_value(after.get("reward")))
        self.done = bool(after.get("done"))
        text = observation_text(after.get("observation") or {})
        if self.done:
            text += "\n\nThe environment says the episode is over."
        return ToolResult(observation=text, output=text, exit_code=0, ends_episode=self.done)

    def verify(self, *, sandbox: Sandbox, task: OpenEnvTask, submitted: bool, open_sandbox: OpenSandbox,
               actions: Sequence[ToolCall]) -> Verdict:
        """The environment's own rewards, as its server gave them to the worker over the bridge."""
        if self._session is None:
            raise GraderFault("verify: expected the openenv session opened by setup, got none")
        given = [r for r in self.rewards if r is not None]
        floor = self.settings.no_action_reward
        if self.failed is not None:
            score, detail = floor, f"the environment's server failed on the agent's action ({self.failed[:200]})"
        elif not self.rewards:
            score, detail = floor, f"no action reached the environment: the spec's no_action_reward, {floor:g}"
        elif self.settings.require_done and not self.done:
            score, detail = floor, f"the episode ended before the environment said done ({len(self.rewards)} steps)"
        elif self.settings.reward == "sum" and given:
            score, detail = sum(given), f"the sum of {len(given)} step rewards"
        elif self.settings.reward == "last" and self.rewards[-1] is not None:
            score, detail = self.rewards[-1], f"the last observation's reward ({len(self.rewards)} steps)"
        else:
            score, detail = floor, "the environment gave no reward (none, or not a finite number)"
        try:  # the environment's own account of the episode (its step count), kept with the layer only
            state = self._session.call("state").get("state")
        except (ActionRefused, SandboxError) as error:
            state = {"error": str(error)[:500]}
        record = {"rewards": self.rewards, "done": self.done, "steps": len(self.rewards), "state": state,
                  "server_pid": self.server_pid}
        layers = [LayerResult("openenv", float(score), self.done and float(score) > 0, detail, record=record)]
        return Verdict(layers=layers)


def action_tool(name: str, action: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI function schema of the agent's one tool: `action` (the environment's action JSON schema)
    less the `metadata` field every OpenEnv action carries."""
    properties = {k: v for k, v in (action.get("properties") or {}).items() if k != "metadata"}
    parameters: dict[str, Any] = {"type": "object", "properties": properties,
                                  "required": [k for k in action.get("required") or [] if k in properties]}
    if action.get("$defs"):
        parameters["$defs"] = action["$defs"]
    description = str(action.get("description") or action.get("title") or "Act in the environment.")[:1000]
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


MAX_REWARD = 1e12


def reward_value(reward: Any) -> float | None:
    """A step's reward as a number: OpenEnv allows bool, int, float or none; anything not finite or beyond
    ±MAX_REWARD (a sum of such would overflow) counts as none."""
    if isinstance(reward, bool):
        return float(reward)
    if not isinstance(reward, (int, float)) or not math.isfinite(reward) or abs(reward) > MAX_REWARD:
        return None
    return float(reward)


def observation_text(observation: dict[str, Any]) -> str:
    """An OpenEnv observation's fields as `name: value` lines (strings as they are, the rest as JSON); the
    reward, `done` and metadata are not the agent's to see."""
    lines = []
    for name, value in observation.items():
        if name in HIDDEN_FIELDS:
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        if len(text) > MAX_FIELD_CHARS:
            text = text[:MAX_FIELD_CHARS] + f" [... {len(text) - MAX_FIELD_CHARS} characters cut]"
        lines.append(f"{name}: {text}")
    return "\n".join(lines) or "(the observation is empty)"
