"""The run page's operational charts in ONE pass (GROUPING SETS) over the ended episodes of the run's
latest WINDOW_GROUPS groups: the staleness histogram, episodes and tokens finished per minute, and
where the time goes (the episodes' stages, and the training steps that trained on those groups). A
window, not the whole run: these describe how the run is doing now, and the cost stays flat however
long the run gets (the groups come from the (run_id, group_index) index, their episodes from the
group_id index)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import and_, bindparam, func, select, tuple_
from sqlalchemy.orm import Session

from api.schemas.runs import RunStats, StalenessBin, ThroughputPoint
from api.services.runs import get
from core.models import Episode, EpisodeGroup, TrainingStep
from core.step_points import analytics_memory, json_keys, number

WINDOW_GROUPS = 2048
THROUGHPUT_WINDOW = timedelta(hours=3)
SKIPPED_TIMINGS = ("total",)
"""Episode timing keys that are sums of the others."""


def _window() -> Any:
    """The run's latest WINDOW_GROUPS groups (id, consumed_step), from the (run_id, group_index) index;
    bind `run`."""
    return (select(EpisodeGroup.id, EpisodeGroup.consumed_step).where(EpisodeGroup.run_id == bindparam("run"))
            .order_by(EpisodeGroup.group_index.desc()).limit(WINDOW_GROUPS).cte("window").prefix_with("MATERIALIZED"))


def _training_time(session: Session, *, run_id: int) -> dict[str, float]:
    """Seconds per `timing_s/<stage>` metric summed over the training steps that trained on the window's
    groups (one row per step, found by the (run_id, step) index)."""
    window = _window()
    steps = select(TrainingStep.metrics).where(
        TrainingStep.run_id == run_id, TrainingStep.step.in_(select(window.c.consumed_step).distinct()))
    totals: dict[str, float] = {}
    for metrics in session.execute(steps, {"run": run_id}).scalars():
        for key, value in metrics.items():
            if key.startswith("timing_s/") and isinstance(value, int | float) and not isinstance(value, bool):
                name = f"training/{key.removeprefix('timing_s/')}"
                totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def _ended_rows(run_id: int, *, current_version: int, keys: list[str]) -> Any:
    """Each ended episode of the window reduced to its staleness (the version that trained it, or would
    train it now, minus its oldest turn's: what the trainer's lag counts for its oldest token), finish
    minute, tokens and timing seconds.
    The window's groups come first with the version that trained on each (at most WINDOW_GROUPS rows),
    then their episodes by the group_id index: no scan of the run's groups, no training-step lookup per
    episode."""
    window = _window()
    trainers = (
        # The weights a step trained are the version before the one it produced (training_steps.policy_version);
        # a group not trained yet would be trained by the current version: the lag the trainer sees.
        select(window.c.id, func.coalesce(TrainingStep.policy_version - 1, current_version).label("version"))
        .outerjoin(TrainingStep, and_(TrainingStep.run_id == run_id, TrainingStep.step == window.c.consumed_step))
        .cte("trainers").prefix_with("MATERIALIZED")
    )
    return (
        select(func.greatest(trainers.c.version - Episode.policy_version, 0).label("lag"),
               func.date_trunc("minute", Episode.finished_at).label("minute"), Episode.num_tokens.label("tokens"),
               *[number(Episode.timings, key).label(f"t{i}") for i, key in enumerate(keys)])
        .select_from(trainers).join(Episode, Episode.group_id == trainers.c.id)
        .where(Episode.run_id == run_id, Episode.termination_reason.is_not(None))
        .subquery("ended")
    )


def stats(session: Session, *, run_id: int) -> RunStats:
    run = get(session, run_id=run_id)
    keys = [key for key in json_keys(session, run_id=run_id, column="timings") if key not in SKIPPED_TIMINGS]
    rows = _ended_rows(run_id, current_version=run.policy_version, keys=keys)
    lag, minute = rows.c.lag, rows.c.minute
    query = select(
        lag, minute, func.grouping(lag, minute), func.count(), func.coalesce(func.sum(rows.c.tokens), 0),
        *[func.sum(rows.c[f"t{i}"]) for i in range(len(keys))],
    ).group_by(func.grouping_sets(tuple_(lag), tuple_(minute), tuple_()))
    analytics_memory(session)
    staleness: list[StalenessBin] = []
    throughput: list[ThroughputPoint] = []
    time_split: dict[str, float] = {}
    for lag_value, at, level, count, tokens, *seconds in session.execute(query, {"run": run_id}):
        if level == 1 and lag_value is not None:  # grouped by lag
            staleness.append(StalenessBin(staleness=int(lag_value), episodes=count))
        elif level == 2 and at is not None:  # grouped by minute
            throughput.append(ThroughputPoint(minute=at, episodes=count, tokens=int(tokens)))
        elif level == 3:  # every ended episode
            time_split = {key: float(value) for key, value in zip(keys, seconds, strict=True) if value is not None}
    throughput.sort(key=lambda point: point.minute)
    if throughput:
        start = throughput[-1].minute - THROUGHPUT_WINDOW
        throughput = [point for point in throughput if point.minute >= start]
    return RunStats(staleness=sorted(staleness, key=lambda b: b.staleness), throughput=throughput,
                    time_split={**time_split, **_training_time(session, run_id=run_id)})
