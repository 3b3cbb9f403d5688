"""The multi-turn agent loop: act → run the tool → observe, until a termination reason.

The token stream is extended exactly: turn k's tokens are the environment text added since turn
k-1 (mask 0) followed by what the policy sampled (mask 1). Nothing is ever re-rendered.

The agent's time budget (`episode_timeout_s`) starts here, when the agent gets its first
observation: leasing a sandbox and setting the task up are the platform's time, not the agent's.
Each turn records the server's weight version before and after its request; a training run refuses
a turn whose version is unknown (a restarted server not re-synced yet): an infrastructure fault.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from core.errors import CrucibleError
from core.schemas.run import Sampling
from core.termination import TerminationReason
from core.versions import parse_label
from environments.base import EnvironmentKind, Sandbox, ToolResult
from environments.parsing import PARSERS, MalformedToolCall
from environments.spec import Limits
from task_workers.episode.errors import PolicyFault, SandboxFault
from task_workers.episode.trajectory import ArtifactRecord, Trajectory, TurnRecord
from task_workers.policy.chat import observation_frame
from task_workers.policy.client import Completion, ContextOverflow, PolicyClient, PolicyError
from task_workers.policy.pool import EpisodePolicy

NO_TOOL_CALL = "No tool call found. Call exactly one tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>."


@dataclass
class LoopContext:
    kind: EnvironmentKind
    task: Any
    sandbox: Sandbox
    policy: PolicyClient | EpisodePolicy
    limits: Limits
    sampling: Sampling
    tool_parser: str = "hermes"
    require_version: bool = False
    """A training run: every turn must carry a known weight version (staleness is measured from it)."""


def cap_text(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters, with the number of characters cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters truncated ...]\n{text[-half:]}"


def _versions(ctx: LoopContext, completion: Completion) -> tuple[int | None, int | None]:
    """(oldest, newest) version that sampled the completion. Every label must name verified weights in
    a training run: "default" is a restarted server not re-synced yet, "N-unverified" weights whose
    probe failed or is still running; either way the turn is an infrastructure fault, retried."""
    versions = [parse_label(label, now=completion.version_after) for label in completion.versions]
    labels = " → ".join(repr(label) for label in completion.versions)
    if ctx.require_version and (not versions or None in versions):
        raise PolicyFault(f"the policy server reported weight versions {labels} (now {completion.version_after!r}); "
                          "expected the run's verified integer versions (a restarted server serves again once the "
                          "trainer has re-synced it)")
    known = [v for v in versions if v is not None]
    if known != sorted(known):
        raise PolicyFault(f"the policy server's weight version went back during a request: {labels}")
    return (known[0], known[-1]) if known else (None, None)


def _generate(ctx: LoopContext, tokens: list[int]) -> Completion | TerminationReason:
    budget = min(ctx.limits.max_response_tokens, ctx.limits.max_context_tokens - len(tokens))
    if budget <= 0:
        return TerminationReason.CONTEXT_EXHAUSTED
    try:
        return ctx.policy.complete(prompt_ids=tokens, max_tokens=budget, sampling=ctx.sampling)
    except ContextOverflow:
        return TerminationReason.CONTEXT_EXHAUSTED
    except PolicyError as error:
        raise PolicyFault(str(error)) from error


def _act(ctx: LoopContext, completion: Completion) -> tuple[ToolResult, dict[str, Any] | None, bool]:
    """Run the completion's tool call. Returns the result, the parsed call, and whether it was a format error."""
    try:
        call = PARSERS[ctx.tool_parser](completion.text)
    except MalformedToolCall as error:
        return ToolResult(observation=str(error), status="error"), None, True
    if call is None:
        return ToolResult(observation=NO_TOOL_CALL, status="error"), None, True
    try:
        result = ctx.kind.execute(sandbox=ctx.sandbox, call=call, task=ctx.task)
    except CrucibleError as error:  # the sandbox layer's own faults (dead container, broken session)
        raise SandboxFault(f"the sandbox failed while running {call.name}: {error}") from error
    if result.status == "sandbox_dead":
        raise SandboxFault(f"the sandbox died while running {call.name}: {result.output[-300:]}")
    return result, {"name": call.name, "arguments": call.arguments}, False


def run_agent_loop(ctx: LoopContext, *, prompt_ids: list[int]) -> Trajectory:
    deadline = time.monotonic() + ctx.limits.episode_timeout_s  # the agent's clock starts now
    trajectory = Trajectory()
    pending_env = list(prompt_ids)  # environment tokens not yet attached to a turn
    tokens = list(prompt_ids)
    format_errors = tool_errors = 0
    while True:
        if time.monotonic() > deadline:
            trajectory.termination = TerminationReason.EPISODE_TIMEOUT
            return trajectory
        completion = _generate(ctx, tokens)
        if isinstance(completion, TerminationReason):
            trajectory.termination = completion
            return trajectory
        trajectory.timings["generation"] += completion.seconds
        version_start, version_end = _versions(ctx, completion)
        started = time.monotonic()
        result, call, format_error = _act(ctx, completion)
        trajectory.timings["sandbox"] += time.monotonic() - started
        observation = cap_text(result.observation, ctx.limits.observation_max_chars)
        trajectory.turns.append(TurnRecord(
            index=len(trajectory.turns), token_ids=pending_env + completion.token_ids,
            logprobs=[0.0] * len(pending_env) + completion.logprobs,
            loss_mask=[0] * len(pending_env) + [1] * len(completion.token_ids), prompt_length=len(pending_env),
            completion_text=completion.text, finish_reason=completion.finish_reason,
            generation_s=completion.seconds, weight_version=version_start, weight_version_end=version_end,
            tool_call=call, observation=observation, tool_output_full=cap_text(result.output, 65536),
            exit_code=result.exit_code, tool_status=result.status, duration_s=result.duration_s,
            truncated=result.truncated_bytes > 0 or observation != result.observation,
            truncated_bytes=result.truncated_bytes, replica=completion.replica,
        ))
        trajectory.artifacts += [ArtifactRecord(len(trajectory.turns) - 1, a.name, a.media_type, a.data)
                                 for a in result.artifacts]
        tokens += completion.token_ids
        format_errors = format_errors + 1 if format_error else 0
        tool_errors = tool_errors + 1 if result.is_error and not format_error else 0
        reason = _termination(ctx, trajectory, result, format_errors, tool_errors)
        if reason is not None:
            trajectory.termination = reason
            trajectory.submitted = reason is TerminationReason.SUBMITTED
            return trajectory
        closed = bool(completion.token_ids) and completion.token_ids[-1] == ctx.policy.end_of_turn_id()
        pending_env = _observation_tokens(ctx, observation, closed=closed)
        tokens += pending_env


def _termination(
    ctx: LoopContext, trajectory: Trajectory, result: ToolResult, format_errors: int, tool_errors: int
) -> TerminationReason | None:
    if result.ends_episode:
        return TerminationReason.SUBMITTED
    if format_errors >= ctx.limits.max_tool_errors:
        return TerminationReason.FORMAT_ERROR
    if tool_errors >= ctx.limits.max_tool_errors:
        return TerminationReason.TOOL_ERROR_LIMIT
    if len(trajectory.turns) >= ctx.limits.max_turns:
        return TerminationReason.MAX_TURNS
    return None


def _observation_tokens(ctx: LoopContext, observation: str, *, closed: bool) -> list[int]:
    """The chat frame's control tokens around the observation, which is plain text: whatever a tool
    prints (`<|im_end|><|im_start|>assistant`) cannot close the tool message or open a turn."""
    before, after = observation_frame(completion_closed=closed)
    try:
        return (ctx.policy.tokenize(before) + ctx.policy.tokenize_plain(f"tool\n{observation}")
                + ctx.policy.tokenize(after))
    except PolicyError as error:
        raise PolicyFault(str(error)) from error


def initial_prompt(ctx: LoopContext, *, instruction: str) -> list[int]:
    messages = [{"role": "system", "content": ctx.kind.system_prompt()}, {"role": "user", "content": instruction}]
    try:
        return ctx.policy.tokenize_chat(messages=messages, tools=ctx.kind.tools())
    except PolicyError as error:
        raise PolicyFault(str(error)) from error

