"""An evaluation's report (`GET /v1/runs/{id}/eval`, `crucible eval show`): pass@1 and pass@k with their
95 % intervals, overall, per environment and per difficulty bucket (api/services/run_eval.py)."""

from __future__ import annotations

from pydantic import BaseModel

from core.schemas.run import CheckpointRef


class RateEstimate(BaseModel):
    value: float
    """The mean over tasks of each task's pass@k (core.stats.pass_at_k)."""
    low: float
    high: float
    """The 95 % interval: a percentile bootstrap over tasks (core.stats); `value` at both ends for one task."""
    tasks: int
    """Tasks in the estimate: those with at least k counted episodes."""


class EvalCell(BaseModel):
    tasks: int
    """Tasks with at least one counted episode."""
    episodes: int
    """Counted episodes: those that ended with the agent's own outcome (status `completed`)."""
    solved: int
    """Counted episodes whose reward reached environments.rewards.SOLVED_AT."""
    excluded: int
    """Episodes that ended by an infrastructure fault (status `failed`): not the policy's doing, not counted."""
    pass_at_1: RateEstimate | None
    pass_at_k: RateEstimate | None
    """None when no task has k counted episodes (or k is 1: it would repeat pass@1)."""


class EvalReport(BaseModel):
    run_id: int
    purpose: str
    status: str
    model: str
    checkpoint: CheckpointRef | None = None
    """The training checkpoint evaluated (`crucible eval launch --run R --step S`); None: `model` as served."""
    split: str
    environments: list[str] = []
    """The environments the run draws from."""
    k: int
    """Samples per task (the run's group size): pass@k's k."""
    unfinished: int
    """Episodes not ended yet (pending or running): the report is final when this is 0 and the run is done."""
    overall: EvalCell
    by_environment: dict[str, EvalCell]
    by_bucket: dict[str, EvalCell]
    """By each task's difficulty bucket as the store holds it now (`unknown` until a pass-rate job measured it)."""
    method: str
    """How the figures are computed, in one sentence."""


class CheckpointEval(BaseModel):
    """One evaluation of a training run's checkpoint: its step and the eval run's report."""

    step: int
    version: int
    report: EvalReport


class CheckpointComparison(BaseModel):
    """`GET /v1/runs/{id}/checkpoint-evals`: every eval run of the training run's checkpoints, by step (then
    by eval run id): success against step, each with its 95 % interval."""

    run_id: int
    evals: list[CheckpointEval]
