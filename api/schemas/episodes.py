"""Episodes: summaries in lists (never token arrays), turns and optionally tokens on one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class EpisodeSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    run_id: int
    group_id: int
    sample_index: int
    task_id: int
    environment_id: int
    environment: str
    status: str
    termination_reason: str | None
    reward: float | None
    reward_components: dict[str, Any]
    policy_version: int | None
    policy_version_last: int | None
    num_turns: int
    num_tokens: int
    prefix_breaks: int = 0
    """Turns whose prompt was not the previous turn's prompt and completion extended (never expected)."""
    unparsed_tool_calls: int = 0
    """Turns whose tool call could not be read."""
    turns_without_tool_call: int = 0
    """Turns whose completion held no tool call (an agent program's: no match of its action syntax)."""
    program: dict[str, Any] | None = None
    """An agent program's episode: its exit_status, why the platform stopped it (`stopped`), its calls,
    refused requests, token segments and last output; null for Crucible's own loop."""
    attempts: int
    timings: dict[str, Any]
    sandbox_id: str | None
    flags: list[str] = []
    """What the hack monitors saw (core.flags.EpisodeFlag values)."""
    awaiting_judging: bool = False
    """Played, its judge's score not in yet: status `scoring` (its judge or reward model did not answer; asked
    again until the run's judge_patience_s), or ended in a group its pairwise judge has not scored yet.
    `reward` and `reward_components` are null and empty until it is (what is stored meanwhile is the tests'
    part alone, not the reward)."""
    created_at: datetime
    finished_at: datetime | None


class EpisodesPublic(BaseModel):
    data: list[EpisodeSummary]
    next_cursor: str | None


class TurnTokens(BaseModel):
    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    """1 = sampled by the policy (trained on), 0 = environment text."""
    pieces: list[str] | None
    """Each token decoded alone, when the run's model directory has a tokenizer."""


class TurnPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    index: int
    prompt_length: int
    num_tokens: int
    completion_text: str
    tool_call: dict[str, Any] | None
    observation: str | None
    tool_output_full: str | None
    exit_code: int | None
    tool_status: str | None
    duration_s: float | None
    generation_s: float | None
    truncated: bool
    truncated_bytes: int
    weight_version: int | None
    """The oldest weight version that sampled a token of this turn."""
    weight_version_end: int | None = None
    """The newest weight version that sampled a token of this turn (differs when a sync landed mid-turn)."""
    finish_reason: str | None
    replica: str | None = None
    """The policy replica that sampled this turn (CRUCIBLE_POLICY_URLS, credentials removed); None with one
    server."""
    segment: int = 0
    """The token stream it continues (an agent program's call that rewrote its context starts the next)."""
    created_at: datetime
    tokens: TurnTokens | None = None
    """Present when asked for with `?tokens=true`."""


class EpisodeDetail(EpisodeSummary):
    task_external_id: str
    instruction: str
    worker: str | None
    started_at: datetime | None
    failures: list[Any]
    verifier_layers: list[Any]
    final_diff: str | None
    turns: list[TurnPublic]


class ArtifactPublic(BaseModel):
    """A file an observation produced (a screenshot, the opening text); its bytes are at
    `GET /v1/episodes/{episode_id}/artifacts/{id}`."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    turn_index: int | None
    """The turn whose observation produced it; null for the opening observation, before the first turn."""
    name: str
    """`screenshot`, `observation` (the opening text), `not_stored` (a note saying what was dropped and why)…"""
    media_type: str
    size: int
    """Bytes."""


class ArtifactsPublic(BaseModel):
    data: list[ArtifactPublic]
    """The opening observation's first, then by turn, in the order they were produced."""
