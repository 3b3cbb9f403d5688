"""GRPO groups: the G rollouts of one task under one policy version, with advantages."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from api.schemas.episodes import EpisodeSummary
from core.termination import GroupStatus


class TurnPreview(BaseModel):
    index: int
    text: str
    """The start of the completion."""
    tool: str | None
    exit_code: int | None
    truncated: bool


class Rollout(EpisodeSummary):
    advantage: float | None
    """The advantage the trainer used for this episode (stored by its step); None: not trained on yet."""
    trained_score: float | None
    """The reward after the trainer's shaping and normalisation, which the advantage came from."""
    turns: list[TurnPreview]


class GroupSummary(BaseModel):
    id: int
    run_id: int
    group_index: int
    task_id: int
    environment_id: int
    environment: str
    size: int
    policy_version: int
    status: GroupStatus
    consumed_step: int | None
    drop_reason: str | None = None
    """Why the trainer dropped it (core.termination.DropReason)."""
    dropped_step: int | None = None
    """The trainer's version when it dropped it."""
    created_at: datetime
    rewarded: int
    """Episodes with a reward so far."""
    reward_mean: float | None
    reward_std: float | None
    degenerate: bool
    """Every rewarded episode got the same reward (zero variance: no learning signal)."""


class GroupsPublic(BaseModel):
    data: list[GroupSummary]
    next_cursor: str | None


class GroupPublic(GroupSummary):
    task_external_id: str
    divergence_turn: int | None
    """First turn index where the rollouts' completions differ (None: identical or no turns)."""
    rollouts: list[Rollout]
