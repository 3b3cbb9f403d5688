"""Runs, their summary counts, training-step metrics and the per-step aggregates of their episodes."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from core.termination import RunPurpose


class RunPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    status: str
    purpose: RunPurpose
    model: str
    mode: str
    group_size: int
    batch_size: int
    max_staleness: int
    policy_version: int
    sync_error: str | None = None
    """Why the last weight publish failed (vLLM kept serving the previous version); None after a success."""
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class RunsPublic(BaseModel):
    data: list[RunPublic]
    next_cursor: str | None


class RunEnvironmentPublic(BaseModel):
    environment_id: int
    name: str
    version: int
    weight: float


class RunSummary(BaseModel):
    episodes: dict[str, int]
    """Episodes by status."""
    groups: dict[str, int]
    """Groups by status: running, complete, consumed, dropped."""
    termination: dict[str, int]
    """Ended episodes by termination reason."""
    flagged: int = 0
    """Scored (completed) episodes the hack monitors flagged."""
    flagged_rate: float | None = None
    """flagged / scored episodes; None before any episode is scored."""
    flags: dict[str, int] = {}
    """Flagged episodes by flag (core.flags.EpisodeFlag)."""
    reward_mean: float | None
    reward_std: float | None
    tokens: int
    turns: int
    training_steps: int
    latest_step: int | None


class RunDetail(RunPublic):
    config: dict[str, Any]
    environments: list[RunEnvironmentPublic]
    summary: RunSummary
    waiting_for_trainer: str | None = None
    """Set while a train run's complete groups wait and no trainer is attached (api/services/run_health)."""
    tool_call_failures: str | None = None
    """Set while the tool calls of the run's latest episodes mostly fail to parse (api/services/run_health)."""


class TrainingStepPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    step: int
    policy_version: int
    metrics: dict[str, Any]
    created_at: datetime


class EpisodePoint(BaseModel):
    """Aggregates of the ended episodes at one x (training step or policy version)."""

    x: int
    episodes: int
    reward_mean: float | None
    reward_std: float | None
    reward_min: float | None
    reward_max: float | None
    by_environment: dict[str, float | None]
    """Mean reward per environment name."""
    components: dict[str, float | None]
    """Mean of each reward component."""
    termination: dict[str, int]


class RunMetrics(BaseModel):
    axis: Literal["step", "version"]
    """`step` when groups have been trained on (x = the step that consumed them), else `version`."""
    steps: list[TrainingStepPublic]
    """The charted training steps, oldest first: every `stride`-th step from the first, and the latest."""
    points: list[EpisodePoint]
    """By step: one per charted step that trained on ended episodes; by version: one per policy version."""
    stride: int
    """1: every training step is charted; k > 1: the run has more steps than `max_points`, every k-th is."""
    total_steps: int
    """The run's training steps (charted or not)."""


class StalenessBin(BaseModel):
    staleness: int
    """Policy versions between the one that generated an episode and the one that trained on it
    (or the run's current version for episodes not trained on yet)."""
    episodes: int


class ThroughputPoint(BaseModel):
    minute: datetime
    episodes: int
    tokens: int


class RunStats(BaseModel):
    """Over the ended episodes of the run's latest 2048 groups: how the run is doing now."""

    staleness: list[StalenessBin]
    throughput: list[ThroughputPoint]
    """Episodes and tokens finished per minute (at most the last 3 hours)."""
    time_split: dict[str, float]
    """Seconds summed over those episodes (generation, sandbox, verify…) and over every training step
    (`training/<stage>` from the `timing_s/<stage>` metrics)."""


class RegradedEpisode(BaseModel):
    episode_id: int
    step: int | None
    """The training step that consumed it (None: not trained on)."""
    before: float | None
    """The reward it was stored (and trained) with."""
    after: float
    """The latest re-grade's reward."""
    flags_before: list[str]
    flags_after: list[str]


class RegradedStep(BaseModel):
    step: int
    episodes: list[int]
    reward_change: float
    """Σ (re-graded − trained-on reward) over those episodes."""


class TokenLagBin(BaseModel):
    lag: int
    """Versions behind the trained policy."""
    tokens: int


class RunStaleness(BaseModel):
    """Why groups were not trained on, how far behind the trained tokens were, and the length-bias check."""

    max_staleness: int
    """The admission bound η."""
    max_token_staleness: int
    """A sampled token lagging more than this had no loss weight."""
    dropped: dict[str, int]
    """Dropped groups by reason (core.termination.DropReason; `unknown` before the reason was stored)."""
    token_lags: list[TokenLagBin]
    """The trained samples' sampled tokens by version lag, over every training step."""
    masked_token_frac: float | None
    """Of those tokens, the fraction the staleness mask took the loss weight from."""
    max_weighted_lag: int | None
    """The largest lag of a token that carried loss weight (≤ max_token_staleness)."""
    trained_episode_s: float | None
    """Mean seconds of the trained groups' episodes (the run's latest 2048 groups)."""
    dispatched_episode_s: float | None
    """Mean seconds of every ended episode there: equal to the above when no length is favoured."""
    trained_episodes: int
    ended_episodes: int


class RunGrading(BaseModel):
    """How the run's hidden tests were graded, and what re-grading found."""

    hidden_grades: int
    """Hidden-test layers graded by a grader that reports blinding (in the run's latest 2048 groups)."""
    unblinded_grades: int
    """Of those, grades with no test blinded (the in-process report was the only evidence)."""
    blinded_test_share: float | None
    """Blinded tests ÷ graded tests over those grades."""
    regraded: int
    graders: list[str]
    changed: list[RegradedEpisode]
    steps: list[RegradedStep]


class StageCost(BaseModel):
    seconds: float | None
    """The stage's seconds in the step (rollout and reward: episode-seconds, summed over its episodes)."""
    work: float | None
    """Tokens through the stage (the reward's: episodes graded)."""


class StepCost(BaseModel):
    """What one training step recorded under `cost/…` (trainer.cost); None where it recorded no number."""

    step: int
    stages: dict[str, StageCost]
    """By stage, in trainer.cost.STAGES order."""
    step_seconds: float | None
    flops: float | None
    flops_per_s: float | None
    mfu: float | None
    """Achieved ÷ the device's peak FLOP/s; None where the peak is unknown (CPU)."""


class StageTotal(BaseModel):
    seconds: float
    work: float
    share: float | None
    """Of the stages' seconds together; None when they sum to 0."""


class CostProjection(BaseModel):
    target_steps: int
    gpus: int
    formula: str
    """trainer.cost.PROJECTION_FORMULA."""
    gpu_hours: float


class RunCost(BaseModel):
    """A run's cost per training step by stage, totals, and a GPU-hours projection (`crucible run cost`)."""

    run_id: int
    steps: list[StepCost]
    """The steps that recorded their cost, oldest first."""
    steps_without_cost: int
    """Steps recorded before cost metrics existed (left out of `steps` and the totals)."""
    totals: dict[str, StageTotal]
    """By stage, over `steps`."""
    flops: float
    flops_per_s_median: float | None
    mfu_median: float | None
    step_seconds_median: float | None
    projection: CostProjection | None
    """With a target number of steps, once a step has recorded its seconds."""
