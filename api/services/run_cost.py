"""A run's cost breakdown: the `cost/…` metrics every training step recorded (see `trainer.cost`),
per step and in total, and a GPU-hours projection for a target number of steps.

    view = run_cost(session, run_id=7, target_steps=1000, gpus=8)

Nothing is estimated here beyond the projection: every number is one the trainer measured or counted.
"""

from __future__ import annotations

import statistics
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.schemas.runs import CostProjection, RunCost, StageCost, StageTotal, StepCost
from api.services.runs import get
from core.models import TrainingStep
from trainer import cost

STAGE_KEYS = {
    "rollout": (cost.ROLLOUT_S, cost.ROLLOUT_TOKENS),
    "update": (cost.UPDATE_S, cost.UPDATE_TOKENS),
    "reference": (cost.REFERENCE_S, cost.REFERENCE_TOKENS),
    "reward": (cost.REWARD_S, cost.REWARD_EPISODES),
}
"""Stage → (seconds key, work key); the reward's work is episodes graded, the others' tokens."""


def _number(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def step_row(step: int, metrics: dict[str, Any]) -> StepCost:
    stages = {stage: StageCost(seconds=_number(metrics, seconds_key), work=_number(metrics, work_key))
              for stage, (seconds_key, work_key) in STAGE_KEYS.items()}
    return StepCost(step=step, stages=stages, step_seconds=_number(metrics, cost.STEP_S),
                    flops=_number(metrics, cost.FLOPS), flops_per_s=_number(metrics, cost.FLOPS_PER_S),
                    mfu=_number(metrics, cost.MFU))


def _sum(values: list[float | None]) -> float:
    return sum(v for v in values if v is not None)


def run_cost(session: Session, *, run_id: int, target_steps: int | None = None, gpus: int = 1) -> RunCost:
    """Per-step rows (steps without cost metrics — recorded before they existed — are left out and
    counted), totals per stage with their share of the stages' seconds, and the projection."""
    if target_steps is not None and target_steps < 1:
        raise ValueError(f"target steps: expected a positive integer, got {target_steps}")
    if gpus < 1:
        raise ValueError(f"gpus: expected a positive integer, got {gpus}")
    get(session, run_id=run_id)  # NotFound for an unknown run
    recorded = session.execute(select(TrainingStep.step, TrainingStep.metrics).where(TrainingStep.run_id == run_id)
                               .order_by(TrainingStep.step)).all()
    rows = [step_row(step, metrics or {}) for step, metrics in recorded
            if isinstance(metrics, dict) and _number(metrics, cost.STEP_S) is not None]
    seconds = {stage: _sum([r.stages[stage].seconds for r in rows]) for stage in STAGE_KEYS}
    all_stages = sum(seconds.values())
    totals = {stage: StageTotal(seconds=seconds[stage], work=_sum([r.stages[stage].work for r in rows]),
                                share=seconds[stage] / all_stages if all_stages > 0 else None) for stage in STAGE_KEYS}
    step_seconds = [r.step_seconds for r in rows if r.step_seconds is not None]
    achieved = [r.flops_per_s for r in rows if r.flops_per_s is not None]
    mfu = [r.mfu for r in rows if r.mfu is not None]
    projection = None
    if target_steps is not None and step_seconds:
        projection = CostProjection(target_steps=target_steps, gpus=gpus, formula=cost.PROJECTION_FORMULA,
                                    gpu_hours=cost.gpu_hours(step_seconds=step_seconds, target_steps=target_steps,
                                                             gpus=gpus))
    return RunCost(
        run_id=run_id, steps=rows, steps_without_cost=len(recorded) - len(rows),
        totals=totals, flops=_sum([r.flops for r in rows]),
        flops_per_s_median=statistics.median(achieved) if achieved else None,
        mfu_median=statistics.median(mfu) if mfu else None,
        step_seconds_median=statistics.median(step_seconds) if step_seconds else None,
        projection=projection,
    )
