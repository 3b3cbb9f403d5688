"""The chat environment kind: open-ended multi-turn dialogue, scored only by the judge layer.

The task is the user's side of a conversation: its instruction is the first user message and
`follow_ups` the messages the user sends after each reply. The agent answers with `reply(message)`;
each reply gets the next follow-up as the environment's answer, and the reply to the last one ends the
episode. Nothing here can tell a good reply from a bad one, so the spec must name a judge
(`verifier.judge`, environments/judge.py) or a reward model (`verifier.reward_model`,
environments/reward_model_layer.py), and the reward is their layers' scores (weight 1 each by default). The sandbox is the trivial one every episode leases: the
dialogue never touches it.

    name: support-chat
    kind: chat
    image: base
    limits: {max_turns: 6, max_response_tokens: 256}
    verifier:
      judge: {url: http://127.0.0.1:8001/v1, model: judge, rubric: "Polite, correct and brief."}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from environments.base import (
    Kind,
    LayerResult,
    OpenSandbox,
    Sandbox,
    ToolCall,
    ToolResult,
    Verdict,
    tool_error,
)
from environments.spec import EnvironmentSpec

SYSTEM_PROMPT = "You are a helpful assistant. Answer the user with the reply tool, one message at a time."
MAX_MESSAGE_CHARS = 16_000
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "reply": {"type": "function", "function": {
        "name": "reply", "description": "Send your message to the user.",
        "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}},
}


class ChatTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    follow_ups: list[Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_CHARS)]] = Field(
        default_factory=list, max_length=32)
    """What the user says after each of the agent's replies, in order (the instruction is the first message)."""


class ChatKind(Kind):
    name = "chat"
    default_weights = {"judge": 1.0, "reward_model": 1.0}
    """The judge's and the reward model's layers are the reward unless `verifier.weights` says otherwise
    (the `dialogue` layer records how far the dialogue got)."""
    example = '{"follow_ups": ["And in French?"]}'

    @classmethod
    def check_spec(cls, spec: EnvironmentSpec) -> None:
        if spec.verifier.judge is None and spec.verifier.reward_model is None:
            raise ValueError("verifier.judge: expected a judge or a reward_model for kind chat (only a learned "
                             "reward scores a dialogue), got neither")

    def __init__(self, spec: EnvironmentSpec) -> None:
        self.spec = spec
        self._replies: dict[int, int] = {}  # id(task) → replies so far in this episode

    def tools(self) -> list[dict[str, Any]]:
        return [TOOL_SCHEMAS[name] for name in self.spec.tools or TOOL_SCHEMAS]

    def system_prompt(self) -> str:
        return self.spec.system_prompt or SYSTEM_PROMPT

    @staticmethod
    def parse_task(payload: dict[str, Any]) -> ChatTask:
        return ChatTask.model_validate(payload)

    def setup(self, *, sandbox: Sandbox, task: ChatTask) -> None:
        self._replies[id(task)] = 0

    def opening(self, *, sandbox: Sandbox, task: ChatTask, instruction: str) -> None:
        """The task's instruction is the first message."""
        return None

    def execute(self, *, sandbox: Sandbox, call: ToolCall, task: ChatTask) -> ToolResult:
        if call.name != "reply":
            return tool_error(f"tool: expected reply, got {json.dumps(call.name)[:80]}", prefix="")
        message = call.arguments.get("message")
        if not isinstance(message, str) or not message.strip():
            return tool_error("reply: expected a non-empty string argument 'message'", prefix="")
        if len(message) > MAX_MESSAGE_CHARS:
            return tool_error(f"reply: expected at most {MAX_MESSAGE_CHARS} characters, got {len(message)}", prefix="")
        done = self._replies.get(id(task), 0)
        self._replies[id(task)] = done + 1
        if done >= len(task.follow_ups):
            return ToolResult(observation="(the user has left the conversation)", exit_code=0, ends_episode=True)
        said = task.follow_ups[done]
        return ToolResult(observation=f"user: {said}", output=said, exit_code=0)

    def verify(self, *, sandbox: Sandbox, task: ChatTask, submitted: bool, open_sandbox: OpenSandbox,
               actions: Sequence[ToolCall]) -> Verdict:
        """No reward of its own: a layer that records how far the dialogue got (the judge scores it)."""
        replies = sum(1 for call in actions if call.name == "reply")
        wanted = len(task.follow_ups) + 1
        layers = [LayerResult("dialogue", 1.0 if submitted else 0.0, submitted,
                              f"{min(replies, wanted)} of {wanted} replies" + ("" if submitted else "; the dialogue did not finish"))]
        return Verdict(layers=layers)
