"""The per-episode model gateway of an agent program: an OpenAI-compatible `/v1/chat/completions` in front of
the episode's policy (its replica lease, versions and quarantine as for Crucible's own loop), which records
every call as a turn.

    gateway = Gateway(ctx, max_calls=30)
    status, body = gateway.handle("POST", "/v1/chat/completions", '{"messages": [...]}')
    gateway.trajectory.turns          # one TurnRecord per call

What a call records is what was sampled: the prompt as the server reports it sampled from (the chat template
rendered by the server, vLLM's echoed prompt ids) and the completion's tokens and logprobs, with the weight
versions of each token (task_workers.episode.loop.sample_turn: settled, resampled under rejected weights).
Calls are stitched into token streams: a call whose prompt extends the previous call's prompt and completion
continues the stream (its turn holds the new environment tokens, then the sampled ones); any other call — the
program rewrote, cut or re-rendered its context — starts a new segment whose turn holds its whole prompt.
Each segment is trained as a sequence of its own (trainer.rollouts), so no re-tokenized text is ever trained
on as if it had been sampled.

The program controls nothing but its messages: the sampling parameters are the run's (a request's
temperature, n, logprobs, tools-as-sampling or model name are ignored), the token budget of a call is the
spec's `max_response_tokens` (less, where the program asks for less) within `max_context_tokens`, and past
`max_calls` chat requests (one refused unread counts too) every call is refused (429) and the episode ends
`max_turns`. The time a sampled call took is the platform's (`waited_s`); a refused one's is the program's.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any

from core.termination import TerminationReason
from task_workers.episode.errors import PolicyFault
from task_workers.episode.loop import LoopContext, episode_chat, sample_turn
from task_workers.episode.trajectory import Trajectory, TurnRecord
from task_workers.policy.client import ContextOverflow, PolicyError, ReplicaUnavailable

ROUTES = ("/v1/chat/completions", "/chat/completions")
MODELS = ("/v1/models", "/models")
MODEL_NAME = "policy"
"""The one model the gateway serves, whatever name a request gives."""


@dataclass
class Gateway:
    ctx: LoopContext
    max_calls: int
    action_regex: str | None = None
    trajectory: Trajectory = field(default_factory=Trajectory)
    ended: TerminationReason | None = None
    """Why no more calls are answered: max_turns (the budget spent), context_exhausted, or episode_timeout (set
    by the program's runner when its own time ran out)."""
    refused: int = 0
    waited_s: float = 0.0
    """Seconds spent answering calls: the platform's time, not the program's."""
    _stream: list[int] = field(default_factory=list)
    _segment: int = -1
    _requests: int = 0

    def __post_init__(self) -> None:
        self._chat = episode_chat(self.ctx)
        self._action = re.compile(self.action_regex, re.DOTALL) if self.action_regex else None

    @property
    def segments(self) -> int:
        return self._segment + 1

    def handle(self, method: str, path: str, body: str) -> tuple[int, str]:
        """(HTTP status, JSON body) for one request of the program. PolicyFault and SandboxFault propagate.
        Only a call that sampled is the platform's time (`waited_s`); a refused one is the program's."""
        started, turns = time.monotonic(), len(self.trajectory.turns)
        try:
            return self._handle(method, path.split("?", 1)[0].rstrip("/"), body)
        finally:
            if len(self.trajectory.turns) > turns:
                self.waited_s += time.monotonic() - started

    def _handle(self, method: str, path: str, body: str) -> tuple[int, str]:
        if method == "GET" and path in MODELS:
            return 200, json.dumps({"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})
        if method != "POST" or path not in ROUTES:
            return self._refuse(404, f"expected POST {ROUTES[0]} (or GET {MODELS[0]}), got {method} {path[:200]}")
        if self.ended is not None:
            return self._refuse(429, f"the episode is over ({self.ended.value}): no more model calls")
        if self._requests >= self.max_calls:  # a request refused unread spends one too: no free retries
            self.ended = TerminationReason.MAX_TURNS
            return self._refuse(429, f"the episode's budget of {self.max_calls} model calls is spent")
        self._requests += 1
        request = _read(body)
        if isinstance(request, str):
            return self._refuse(400, request)
        messages, tools, max_tokens = request
        try:
            prompt = self.ctx.policy.tokenize_chat(messages=messages, tools=tools)
        except ContextOverflow as error:
            self.ended = TerminationReason.CONTEXT_EXHAUSTED
            return self._refuse(400, f"the context window is full: {error}")
        except ReplicaUnavailable as error:  # the server's fault, not the program's: the episode is retried
            raise PolicyFault(str(error)) from error
        except PolicyError as error:  # the server refused these messages (its template cannot render them)
            return self._refuse(400, f"the chat template cannot render these messages: {error}")
        limits = self.ctx.limits
        ctx = self.ctx if max_tokens is None else replace(self.ctx, limits=limits.model_copy(
            update={"max_response_tokens": min(max_tokens, limits.max_response_tokens)}))
        sampled = sample_turn(ctx, prompt, self.trajectory)
        if isinstance(sampled, TerminationReason):
            self.ended = sampled
            return self._refuse(400, f"the context window is full ({len(prompt)} prompt tokens of "
                                     f"{limits.max_context_tokens}): {sampled.value}")
        completion, versions = sampled
        turn = self._stitch(list(completion.prompt_ids) if completion.prompt_ids is not None else prompt,
                            completion.token_ids)
        fresh = len(turn) - len(completion.token_ids)  # the environment tokens new to the stream
        text = _without_end_of_turn(completion.text, self._chat.renderer.end_of_turn)
        self.trajectory.turns.append(TurnRecord(
            index=len(self.trajectory.turns), token_ids=turn, logprobs=[0.0] * fresh + completion.logprobs,
            loss_mask=[0] * fresh + [1] * len(completion.token_ids), prompt_length=fresh, completion_text=completion.text,
            finish_reason=completion.finish_reason, generation_s=completion.seconds, weight_version=versions.start,
            weight_version_end=versions.end, version_runs=versions.runs, replica=completion.replica,
            segment=self._segment))
        if self._action is not None and not self._action.search(text):
            self.trajectory.turns_without_tool_call += 1
        finish = "length" if completion.finish_reason == "length" else "stop"
        return 200, json.dumps({
            "id": f"crucible-{len(self.trajectory.turns)}", "object": "chat.completion", "created": int(time.time()),
            "model": MODEL_NAME, "choices": [{"index": 0, "finish_reason": finish,
                                              "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion.token_ids),
                      "total_tokens": len(prompt) + len(completion.token_ids)}})

    def _stitch(self, prompt: list[int], completion: list[int]) -> list[int]:
        """The turn's tokens: the prompt's new tokens when it extends the stream, else all of it as a new
        segment; then the sampled ones. The stream moves on to include them."""
        if self._segment < 0 or prompt[:len(self._stream)] != self._stream:
            self._segment += 1
            self._stream = []
        turn = prompt[len(self._stream):] + completion
        self._stream = prompt + completion
        return turn

    def _refuse(self, status: int, message: str) -> tuple[int, str]:
        self.refused += 1
        return status, json.dumps({"error": {"message": f"crucible gateway: {message}", "code": status}})


def _read(body: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, int | None] | str:
    """The messages, tools and max_tokens of a chat request, or what is wrong with it."""
    try:
        request = json.loads(body)
    except ValueError:
        return f"expected a JSON body, got {body[:100]!r}"
    if not isinstance(request, dict):
        return f"expected a JSON object, got {type(request).__name__}"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: expected a non-empty list of {role, content}"
    read: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"messages[{index}]: expected {{role, content}}, got {str(message)[:100]}"
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
            parts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
            if len(parts) != len(content) or not all(isinstance(part, str) for part in parts):
                return f"messages[{index}].content: expected text parts only"
            content = "".join(parts)  # type: ignore[arg-type]
        if content is None:
            content = ""
        if not isinstance(content, str):
            return f"messages[{index}].content: expected a string, got {type(content).__name__}"
        read.append({"role": message["role"], "content": content})
    tools = request.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
        return "tools: expected a list of function schemas"
    max_tokens = request.get("max_tokens", request.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        return f"max_tokens: expected a positive integer, got {max_tokens!r}"
    return read, tools or None, max_tokens


def _without_end_of_turn(text: str, end_of_turn: tuple[str, ...]) -> str:
    """The reply as the program sees it: without the end-of-turn token the template writes back itself."""
    for marker in end_of_turn:
        if text.endswith(marker):
            return text[: -len(marker)]
    return text
