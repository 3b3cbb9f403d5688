"""The multi-turn agent loop: act → run the tool → observe, until a termination reason.

The token stream is extended exactly: turn k's tokens are the environment text added since turn
k-1 (mask 0) followed by what the policy sampled (mask 1). Nothing is ever re-rendered. The frame
around each observation, the end-of-turn tokens, the tool-call parser and the feedback for a reply
without a call are those of the served model's chat-template family (core/renderers.py), asked of the
policy client once per episode.

Each episode counts what went wrong with the turn frame (Trajectory, stored with the episode):
`unparsed_tool_calls` (a call begun that did not parse), `turns_without_tool_call`, and
`prefix_breaks`: turns whose prompt, as the server reports it sampled from (vLLM's echoed
`prompt_token_ids`; what was sent when it does not echo), is not what the trainer trains on as that
turn's context (every stored turn's tokens, then the environment tokens pending): the previous turn's prompt and
completion extended. That is the property the trainer depends on — it trains on exactly what was
sampled — so it is checked every turn. Whether the model's template, re-rendering the conversation,
would give the same stream is not counted: sampled tokens need not be the canonical tokenization of
their text, and real templates are not prefix-stable by design (Mistral's writes the system prompt
and tools into the last user turn, Llama 3 stamps today's date), so such a count would flag healthy
episodes. That the family's frame is what its template renders is proven once, by the renderer tests
(tests/core/test_renderers.py), not per turn.

The agent's time budget (`episode_timeout_s`) is the agent's own time: what its tool calls spent in
the sandbox, counted from its first observation. The platform's time is not charged: leasing a
sandbox and setting the task up, and every second a completion waits on the policy servers (queued
behind other episodes, paused for a weight sync, held on a quarantined replica, its label polled).
What the agent samples is bounded by tokens instead (`max_turns` × `max_response_tokens`, within
`max_context_tokens`). So one trajectory ends the same way under sync and async training; a platform
that hangs is the worker's time limit's business (an infrastructure fault, retried).
Each turn records the weight version of every token it sampled (`version_runs`, from the server's
spans) and the oldest and newest of them (labels: core/versions.py). A label still provisional (the
trainer's probe is running) is settled by asking the server again, for at most `settle_timeout_s`:
verified, the turn is kept as version N; failed (the server rolled back, or moved on before the
worker saw that load committed), the completion is thrown away and the turn sampled again from the
same context, so nothing sampled by rejected weights is ever stored. A training run refuses a turn
whose version stays unknown (a restarted server not re-synced yet, a probe that never settles) or that
another run's weights sampled: an infrastructure fault, the episode retried.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import CrucibleError
from core.renderers import HERMES_CALL, RENDERERS, Frame, Renderer
from core.schemas.episode import ToolCallRecord
from core.schemas.run import Sampling
from core.seeds import turn_seed
from core.termination import TerminationReason
from core.token_versions import from_spans
from core.versions import LabelState, Settled, settle
from environments.base import EnvironmentKind, Sandbox, ToolCall, ToolResult, ToolStatus
from environments.parsing import AUTO, PARSERS, MalformedToolCall
from environments.spec import Limits
from task_workers.episode.errors import PolicyFault, SandboxFault
from task_workers.episode.trajectory import ArtifactRecord, Trajectory, TurnRecord
from task_workers.policy.client import Completion, ContextOverflow, PolicyClient, PolicyError
from task_workers.policy.pool import EpisodePolicy

logger = logging.getLogger(__name__)


@dataclass
class LoopContext:
    kind: EnvironmentKind
    task: Any
    sandbox: Sandbox
    policy: PolicyClient | EpisodePolicy
    limits: Limits
    sampling: Sampling
    tool_parser: str = AUTO
    """A name in environments.parsing.PARSERS, or `auto`: the served model's family's parser."""
    seed: int | None = None
    """The episode's sampling seed (core.seeds.episode_seed); each turn sends its own (turn_seed).
    None: vLLM draws its own."""
    require_version: bool = False
    """A training run: every turn must carry a known weight version (staleness is measured from it)."""
    run: int | None = None
    """A training run's id: every label must be this run's (or name no run); another run's weights
    sampling a turn is an infrastructure fault."""
    expect_version: int | None = None
    """An eval run of a checkpoint: every label of every turn must be this one (core.versions.checkpoint_tag,
    unique to the evaluation); a turn sampled by other weights is an infrastructure fault, never stored."""
    settle_timeout_s: float = 120.0
    """How long a turn sampled under provisional weights waits for their probe to decide."""
    settle_poll_s: float = 0.25
    resamples: int = 2
    """How many times a turn sampled by weights whose probe failed is sampled again before the
    episode is given up as an infrastructure fault."""


def cap_text(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters, with the number of characters cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters truncated ...]\n{text[-half:]}"


@dataclass(frozen=True)
class _Versions:
    start: int | None
    end: int | None
    runs: list[int] | None
    """Per sampled token, run-length encoded (core/token_versions.py); None when not known."""


@dataclass(frozen=True)
class EpisodeChat:
    """The served model's turn frame for one episode (core/renderers.py), and the call format of the parser
    in use: what the system prompt and the feedback tell the model to write is what is parsed."""

    renderer: Renderer
    parse: Callable[[str], ToolCall | None]
    call_format: str
    end_of_turn: frozenset[int]

    @property
    def no_tool_call(self) -> str:
        return f"No tool call found. Call exactly one tool as {self.call_format}."


def episode_chat(ctx: LoopContext) -> EpisodeChat:
    try:
        renderer, end_of_turn = ctx.policy.renderer(), ctx.policy.end_of_turn_ids()
    except PolicyError as error:
        raise PolicyFault(str(error)) from error
    name = renderer.tool_parser if ctx.tool_parser == AUTO else ctx.tool_parser
    # an explicit parser's own family's format (browsergym reads Hermes calls too), else the model's
    call_format = next((r.call_format for r in RENDERERS.values() if r.tool_parser == name), HERMES_CALL)
    return EpisodeChat(renderer, PARSERS[name], call_format if ctx.tool_parser != AUTO else renderer.call_format,
                       frozenset(end_of_turn))


class _RejectedWeights(Exception):
    """The completion was sampled (at least in part) by weights whose probe failed."""


def _settled(ctx: LoopContext, completion: Completion) -> list[Settled]:
    """Every label of the completion (its spans', then the bracket's) settled, polling the server while
    one is pending, for at most `settle_timeout_s` (a training run's only)."""
    labels = [label for label, _, _ in completion.spans] + list(completion.versions)
    now = completion.version_after
    seen = frozenset(label for label in labels if label is not None)
    if not ctx.require_version:  # nothing trains on it: the labels are only shown, as they are now
        return [settle(label, now=now, seen=seen) for label in labels]
    deadline = time.monotonic() + ctx.settle_timeout_s
    while True:
        states = [settle(label, now=now, run=ctx.run, seen=seen) for label in labels]
        if foreign := [state for state in states if state.state is LabelState.FOREIGN]:
            whose = f"run {foreign[0].run}'s weights" if foreign[0].run is not None else "a checkpoint evaluation's weights"
            raise PolicyFault(f"the policy server reported weight versions {' → '.join(map(repr, completion.versions))}: "
                              f"{whose} sampled a turn of run {ctx.run}; expected this run's own "
                              "(another trainer or evaluation pushes to this run's policy servers)")
        if any(state.state is LabelState.FAILED for state in states):
            raise _RejectedWeights(" → ".join(repr(label) for label in completion.versions))
        if not any(state.state is LabelState.PENDING for state in states) or time.monotonic() >= deadline:
            return states
        time.sleep(ctx.settle_poll_s)
        try:
            now = ctx.policy.weight_version()
        except PolicyError as error:
            raise PolicyFault(str(error)) from error


def _versions(ctx: LoopContext, completion: Completion) -> _Versions:
    """The versions that sampled the completion. Every label must name verified weights in a training
    run: "default" is a restarted server not re-synced yet, a pending "N-unverified" a probe that did
    not decide in time; either way the turn is an infrastructure fault, retried."""
    states = _settled(ctx, completion)
    labels = " → ".join(repr(label) for label in completion.versions)
    if ctx.require_version and (not states or any(state.version is None for state in states)):
        raise PolicyFault(f"the policy server reported weight versions {labels} (now {completion.version_after!r}); "
                          "expected the run's verified integer versions (a restarted server serves again once the "
                          "trainer has re-synced it; provisional weights once their probe has passed)")
    if ctx.expect_version is not None and any(state.version != ctx.expect_version for state in states):
        raise PolicyFault(f"the policy server reported weight versions {labels} (now {completion.version_after!r}); "
                          f"this eval run evaluates the checkpoint loaded under label {ctx.expect_version}: other "
                          "weights replaced it (a trainer's push?)")
    span_states, bracket = states[:len(completion.spans)], states[len(completion.spans):]
    known = [state.version for state in bracket if state.version is not None]
    if known != sorted(known):
        raise PolicyFault(f"the policy server's weight version went back during a request: {labels}")
    runs = None
    if completion.spans and all(state.version is not None for state in span_states):
        spans = [(int(state.version), start, end)  # type: ignore[arg-type]  # checked just above
                 for (_, start, end), state in zip(completion.spans, span_states, strict=True)]
        try:  # the spans must cover the completion exactly, their versions never going back
            runs = from_spans(spans, length=len(completion.token_ids))
        except ValueError as error:
            raise PolicyFault(f"the policy server's weight versions {labels} cannot be trusted: {error}") from None
    return _Versions(known[0] if known else None, known[-1] if known else None, runs)


def sample_turn(ctx: LoopContext, tokens: list[int], trajectory: Trajectory) -> tuple[Completion, _Versions] | TerminationReason:
    """A completion and its settled versions; sampled again (up to `resamples` times) when weights
    whose probe failed sampled it, so that it is never stored."""
    for attempt in range(ctx.resamples + 1):
        seed = None if ctx.seed is None else turn_seed(ctx.seed, turn=len(trajectory.turns), attempt=attempt)
        completion = _generate(ctx, tokens, seed=seed)
        if isinstance(completion, TerminationReason):
            return completion
        trajectory.timings["generation"] += completion.seconds
        try:
            return completion, _versions(ctx, completion)
        except _RejectedWeights as rejected:
            logger.warning("a turn was sampled by weights whose probe failed (%s): sampled again", rejected)
            if attempt == ctx.resamples:
                raise PolicyFault(f"the turn was sampled {attempt + 1} times by weights whose probe failed "
                                  f"({rejected}); expected verified weights") from None
    raise AssertionError("unreachable")


def _generate(ctx: LoopContext, tokens: list[int], *, seed: int | None) -> Completion | TerminationReason:
    budget = min(ctx.limits.max_response_tokens, ctx.limits.max_context_tokens - len(tokens))
    if budget <= 0:
        return TerminationReason.CONTEXT_EXHAUSTED
    try:
        return ctx.policy.complete(prompt_ids=tokens, max_tokens=budget, sampling=ctx.sampling, seed=seed)
    except ContextOverflow:
        return TerminationReason.CONTEXT_EXHAUSTED
    except PolicyError as error:
        raise PolicyFault(str(error)) from error


def _act(ctx: LoopContext, chat: EpisodeChat, completion: Completion
         ) -> tuple[ToolResult, dict[str, Any] | None, str | None]:
    """Run the completion's tool call. Returns the result, the parsed call, and its format error, if
    any: `unparsed` (a call that cannot be read) or `missing` (no call)."""
    try:
        call = chat.parse(completion.text)
    except MalformedToolCall as error:
        return ToolResult(observation=str(error), status=ToolStatus.ERROR), None, "unparsed"
    if call is None:
        return ToolResult(observation=chat.no_tool_call, status=ToolStatus.ERROR), None, "missing"
    try:
        result = ctx.kind.execute(sandbox=ctx.sandbox, call=call, task=ctx.task)
    except CrucibleError as error:  # the sandbox layer's own faults (dead container, broken session)
        raise SandboxFault(f"the sandbox failed while running {call.name}: {error}") from error
    if result.status == ToolStatus.SANDBOX_DEAD:
        raise SandboxFault(f"the sandbox died while running {call.name}: {result.output[-300:]}")
    return result, ToolCallRecord(name=call.name, arguments=call.arguments).stored(), None


def _breaks_prefix(completion: Completion, *, sent: list[int], trajectory: Trajectory, pending: list[int]) -> bool:
    """Whether the prompt the server sampled from (echoed, else `sent`) differs from what the trainer will
    train on as this turn's context: every stored turn's tokens, then the environment tokens pending."""
    stored = [token for turn in trajectory.turns for token in turn.token_ids] + pending
    sampled_from = list(completion.prompt_ids) if completion.prompt_ids is not None else sent
    return sampled_from != stored or sent != stored


def run_agent_loop(ctx: LoopContext, *, prompt_ids: list[int]) -> Trajectory:
    trajectory = Trajectory()
    chat = episode_chat(ctx)
    pending_env = list(prompt_ids)  # environment tokens not yet attached to a turn
    tokens = list(prompt_ids)
    format_errors = tool_errors = 0
    while True:
        if trajectory.timings["sandbox"] > ctx.limits.episode_timeout_s:  # the agent's own time, spent
            trajectory.termination = TerminationReason.EPISODE_TIMEOUT
            return trajectory
        sampled = sample_turn(ctx, tokens, trajectory)
        if isinstance(sampled, TerminationReason):
            trajectory.termination = sampled
            return trajectory
        completion, versions = sampled
        if _breaks_prefix(completion, sent=tokens, trajectory=trajectory, pending=pending_env):
            trajectory.prefix_breaks += 1
            logger.warning("turn %d's prompt is not the previous turn's extended", len(trajectory.turns))
        started = time.monotonic()
        result, call, problem = _act(ctx, chat, completion)
        trajectory.timings["sandbox"] += time.monotonic() - started
        format_error = problem is not None
        trajectory.unparsed_tool_calls += problem == "unparsed"
        trajectory.turns_without_tool_call += problem == "missing"
        observation = cap_text(result.observation, ctx.limits.observation_max_chars)
        trajectory.turns.append(TurnRecord(
            index=len(trajectory.turns), token_ids=pending_env + completion.token_ids,
            logprobs=[0.0] * len(pending_env) + completion.logprobs,
            loss_mask=[0] * len(pending_env) + [1] * len(completion.token_ids), prompt_length=len(pending_env),
            completion_text=completion.text, finish_reason=completion.finish_reason,
            generation_s=completion.seconds, weight_version=versions.start, weight_version_end=versions.end,
            version_runs=versions.runs,
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
        reason = episode_end(ctx.limits, result=result, turns=len(trajectory.turns), format_errors=format_errors,
                             tool_errors=tool_errors)
        if reason is not None:
            trajectory.termination = reason
            trajectory.submitted = reason is TerminationReason.SUBMITTED
            return trajectory
        closed = bool(completion.token_ids) and completion.token_ids[-1] in chat.end_of_turn
        pending_env = _observation_tokens(ctx, chat.renderer.frame(observation, completion_closed=closed,
                                                                   turn=len(trajectory.turns) - 1))
        tokens += pending_env


def episode_end(
    limits: Limits, *, result: ToolResult, turns: int, format_errors: int, tool_errors: int
) -> TerminationReason | None:
    """Why the episode ends after a turn whose tool gave `result` (the `turns`-th; the error counts are
    consecutive), or None: the one rule, for the agent loop and for an OpenEnv session
    (task_workers.openenv_server)."""
    if result.ends_episode:
        return TerminationReason.SUBMITTED
    if format_errors >= limits.max_tool_errors:
        return TerminationReason.FORMAT_ERROR
    if tool_errors >= limits.max_tool_errors:
        return TerminationReason.TOOL_ERROR_LIMIT
    if turns >= limits.max_turns:
        return TerminationReason.MAX_TURNS
    return None


def _observation_tokens(ctx: LoopContext, frame: Frame) -> list[int]:
    """The chat frame's control tokens around the observation, which is plain text: whatever a tool
    prints (`<|im_end|><|im_start|>assistant`, `<|eot_id|>`) cannot close the tool message or open a turn."""
    try:
        return (ctx.policy.tokenize(frame.before) + ctx.policy.tokenize_plain(frame.text)
                + ctx.policy.tokenize(frame.after))
    except PolicyError as error:
        raise PolicyFault(str(error)) from error


def initial_prompt(ctx: LoopContext, *, instruction: str) -> list[int]:
    """The served template's rendering of the system prompt, the instruction and the tools. A prompt that
    says how to write a call says it in Hermes' spelling (core.renderers.HERMES_CALL): it is told in the
    format the episode's parser reads, so a Llama 3 model is never asked for `<tool_call>` and then
    parsed as Llama 3."""
    system = ctx.kind.system_prompt().replace(HERMES_CALL, episode_chat(ctx).call_format)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": instruction}]
    try:
        return ctx.policy.tokenize_chat(messages=messages, tools=ctx.kind.tools())
    except PolicyError as error:
        raise PolicyFault(str(error)) from error

