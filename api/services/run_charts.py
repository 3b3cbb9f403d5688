"""What the run page charts per training step (or per policy version before any step): the training-step
metrics and the points of the ended episodes (`core.step_points`), for at most `max_points` steps.

The trainer stores each step's point with the step, so a run's points are read from its training_steps
rows, one row per charted step; only steps stored before the trainer kept points (`points` NULL) are
computed from their episodes, and a run not trained on yet is charted by policy version from its
episodes. A run with more steps than `max_points` is charted at every `stride`-th step from its first,
plus its latest: the rows read stay bounded however long the run gets.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Integer, Row, any_, cast, exists, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from api.schemas.runs import RunMetrics
from api.services.runs import get
from core.models import EpisodeGroup, TrainingStep
from core.step_points import Axis, Point, episode_points

DEFAULT_MAX_POINTS = 1000
MAX_POINTS = 10_000


def chart_axis(session: Session, *, run_id: int) -> Axis:
    """`step` once any group has been trained on, else `version`."""
    consumed = exists().where(EpisodeGroup.run_id == run_id, EpisodeGroup.consumed_step.is_not(None))
    return "step" if session.execute(select(consumed)).scalar_one() else "version"


def stride_for(*, first: int, latest: int, total: int, max_points: int) -> int:
    """The smallest step stride k that charts at most `max_points` steps: with k = ceil(span / (max_points
    − 1)), first, first + k, … below the latest are at most max_points − 1 steps, and the latest ends them."""
    if total <= max_points:
        return 1
    return max(1, math.ceil((latest - first) / (max_points - 1)))


STEP_COLUMNS = (TrainingStep.step, TrainingStep.policy_version, TrainingStep.metrics, TrainingStep.created_at,
                TrainingStep.points)


def sampled_steps(session: Session, *, run_id: int, max_points: int) -> tuple[list[Row[Any]], int, int]:
    """(the training steps to chart as rows of STEP_COLUMNS, oldest first; the stride; how many steps the
    run has). The wanted step numbers go to Postgres as one array, looked up in the (run_id, step) index:
    at most `max_points` rows are read (as plain rows: no ORM identity map for a thousand steps)."""
    assert max_points >= 2, "the first and the latest step are always charted"
    first, latest, total = session.execute(
        select(func.min(TrainingStep.step), func.max(TrainingStep.step), func.count())
        .where(TrainingStep.run_id == run_id)
    ).one()
    if not total:
        return [], 1, 0
    stride = stride_for(first=first, latest=latest, total=total, max_points=max_points)
    query = select(*STEP_COLUMNS).where(TrainingStep.run_id == run_id).order_by(TrainingStep.step)
    if stride > 1:
        wanted = [*range(first, latest, stride), latest]
        query = query.where(TrainingStep.step == any_(cast(wanted, ARRAY(Integer))))
    return list(session.execute(query)), stride, total


def _step_points(session: Session, *, run_id: int, steps: list[Row[Any]]) -> list[Point]:
    """The stored point of each step; those never stored computed from the episodes (in one pass). A step
    without ended episodes has no point."""
    missing = [row.step for row in steps if row.points is None]
    computed = episode_points(session, run_id=run_id, axis="step", steps=missing)
    points = [{**row.points, "x": row.step} if row.points is not None else computed.get(row.step) for row in steps]
    return [point for point in points if point and point["episodes"]]


def metrics(session: Session, *, run_id: int, max_points: int = DEFAULT_MAX_POINTS) -> RunMetrics:
    """Training-step rows and the per-x points of the run's ended episodes, at most `max_points` steps."""
    get(session, run_id=run_id)
    axis = chart_axis(session, run_id=run_id)
    steps, stride, total = sampled_steps(session, run_id=run_id, max_points=max_points)
    if axis == "step":
        points = _step_points(session, run_id=run_id, steps=steps)
    else:
        by_version = episode_points(session, run_id=run_id, axis="version")
        points = [by_version[x] for x in sorted(by_version)]
    return RunMetrics.model_validate({"axis": axis, "steps": steps, "points": points, "stride": stride,
                                      "total_steps": total})
