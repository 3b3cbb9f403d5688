"""The read_number environment kind: tools `bash` and `submit(answer)`; reward 1 for the exact number.

An episode: the task's file is written into the workspace; the agent reads it (`bash`, e.g.
`cat number.txt`) and calls `submit` with the number. The verifier grades the answer of the `submit`
call itself, never a file in the sandbox the agent could have written.

    name: read-number
    kind: read_number
    image: code-repo
    limits: {max_turns: 4, max_context_tokens: 1024, max_response_tokens: 48, max_tool_errors: 2}
    verifier: {weights: {answer: 1.0}}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from environments.base import (
    Kind,
    LayerResult,
    OpenSandbox,
    Sandbox,
    ToolCall,
    ToolResult,
    ToolStatus,
    Verdict,
    tool_error,
)
from environments.read_number.task import ReadNumberTask, instruction_for
from environments.spec import EnvironmentSpec

WORKSPACE = "/workspace"
SYSTEM_PROMPT = "Use the tools to find the number, then submit it."
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "bash": {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command in the workspace.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    "submit": {"type": "function", "function": {
        "name": "submit", "description": "Submit the answer; this ends the episode.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
}


class ReadNumberKind(Kind):
    name = "read_number"
    default_weights = {"answer": 1.0}
    example = '{"path": "number.txt", "number": "42"}'

    @staticmethod
    def default_instruction(task: ReadNumberTask) -> str:
        return instruction_for(task)

    def __init__(self, spec: EnvironmentSpec) -> None:
        self.spec = spec

    def tools(self) -> list[dict[str, Any]]:
        return [TOOL_SCHEMAS[name] for name in self.spec.tools or TOOL_SCHEMAS]

    def system_prompt(self) -> str:
        return self.spec.system_prompt or SYSTEM_PROMPT

    @staticmethod
    def parse_task(payload: dict[str, Any]) -> ReadNumberTask:
        return ReadNumberTask.model_validate(payload)

    def setup(self, *, sandbox: Sandbox, task: ReadNumberTask) -> None:
        sandbox.put_files({f"{WORKSPACE}/{task.path}": f"{task.number}\n".encode()})

    def opening(self, *, sandbox: Sandbox, task: ReadNumberTask, instruction: str) -> None:
        """The task's instruction is the first message."""
        return None

    def execute(self, *, sandbox: Sandbox, call: ToolCall, task: ReadNumberTask) -> ToolResult:
        if call.name == "bash":
            command = call.arguments.get("command")
            if not isinstance(command, str) or not command.strip():
                return tool_error("bash: expected a non-empty string argument 'command'", prefix="")
            step = sandbox.step(command, timeout_s=self.spec.limits.tool_timeout_s)
            return ToolResult(observation=step.output, output=step.output, exit_code=step.exit_code,
                              status=ToolStatus.of_step(step.status), duration_s=step.duration_s,
                              truncated_bytes=step.truncated_bytes)
        if call.name == "submit":
            return ToolResult(observation="submitted", exit_code=0, ends_episode=True)
        return tool_error(f"tool: expected one of {', '.join(TOOL_SCHEMAS)}, got {json.dumps(call.name)}", prefix="")

    def verify(self, *, sandbox: Sandbox, task: ReadNumberTask, submitted: bool, open_sandbox: OpenSandbox,
               actions: Sequence[ToolCall]) -> Verdict:
        answer = ""
        submits = [call for call in actions if call.name == "submit"]
        if submitted and submits:
            value = submits[-1].arguments.get("answer")
            answer = value if isinstance(value, str) else json.dumps(value)
        correct = answer.strip() == task.number
        layers = [
            LayerResult("submitted", 1.0 if submitted else 0.0, submitted, "" if submitted else "no submission"),
            LayerResult("answer", 1.0 if correct else 0.0, correct, f"expected {task.number}, got {answer[:40]!r}"),
        ]
        return Verdict(layers=layers)
