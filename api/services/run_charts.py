"""What the run page charts: training-step metrics, per-step (or per-version) aggregates of the ended
episodes, the staleness histogram, throughput and the time split.

Each chart family is ONE pass over the run's ended episodes (`termination_reason IS NOT NULL`): GROUPING
SETS give several groupings at once, and JSONB fields (reward components, timings) are read key by key
(`col ->> 'key'`), never expanded row by row with `jsonb_each`. The keys come from a small sample of
the run's episodes (see `json_keys`). Nothing here reads turns or token arrays.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from sqlalchemy import Float, Select, case, cast, exists, func, select, text, tuple_
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from api.services.point_cache import STEP_POINTS
from api.services.runs import get
from core.models import Environment, Episode, EpisodeGroup, Run, TrainingStep

THROUGHPUT_WINDOW = timedelta(hours=3)
ANALYTICS_WORK_MEM = "64MB"
KEY_SAMPLE = 100
"""Episodes read at each end (first and latest) of each environment of a run to find JSONB keys."""
_KEYS_SQL = """
WITH envs AS (
  SELECT environment_id FROM run_environments WHERE run_id = :run
  UNION SELECT environment_id FROM (SELECT environment_id FROM episodes WHERE run_id = :run LIMIT 1) AS any_one),
ids AS (  -- index-only scans of (run_id, environment_id, id): the first and the latest of each environment
  SELECT s.id FROM envs, LATERAL (
    (SELECT e.id FROM episodes e WHERE e.run_id = :run AND e.environment_id = envs.environment_id
     ORDER BY e.id DESC LIMIT :n)
    UNION ALL
    (SELECT e.id FROM episodes e WHERE e.run_id = :run AND e.environment_id = envs.environment_id
     ORDER BY e.id LIMIT :n)) AS s),
sample AS (SELECT e.{column} AS doc FROM episodes e WHERE e.id IN (SELECT id FROM ids))
SELECT DISTINCT key FROM sample, jsonb_object_keys(sample.doc) AS key WHERE jsonb_typeof(sample.doc) = 'object'
ORDER BY key
"""


def json_keys(session: Session, *, run_id: int, column: str) -> list[str]:
    """Keys of an episodes JSONB column (`reward_components`, `timings`) in the run: those of the first
    and latest KEY_SAMPLE ended episodes of each of its environments (an environment is pinned per run,
    so its episodes share their keys)."""
    assert column in ("reward_components", "timings")
    return list(session.execute(text(_KEYS_SQL.format(column=column)), {"run": run_id, "n": KEY_SAMPLE}).scalars())


def number(column: Any, key: str) -> ColumnElement[Any]:
    """`column ->> key` as a float where it is a JSON number, else NULL (never a cast error)."""
    return case((func.jsonb_typeof(column[key]) == "number", cast(column[key].astext, Float)))


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def chart_axis(session: Session, *, run_id: int) -> str:
    """`step` once any group has been trained on, else `version`."""
    consumed = exists().where(EpisodeGroup.run_id == run_id, EpisodeGroup.consumed_step.is_not(None))
    return "step" if session.execute(select(consumed)).scalar_one() else "version"


def _x(axis: str) -> ColumnElement[Any]:
    column = EpisodeGroup.consumed_step if axis == "step" else Episode.policy_version
    return column.expression


def _ended(query: Select[Any], *, run_id: int, axis: str) -> Select[Any]:
    """Restrict `query` (over episodes) to the run's ended episodes that have an x."""
    if axis == "step":
        query = query.join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
    return query.where(Episode.run_id == run_id, Episode.termination_reason.is_not(None), _x(axis).is_not(None))


def _point(x: int) -> dict[str, Any]:
    return {"x": x, "episodes": 0, "reward_mean": None, "reward_std": None, "reward_min": None,
            "reward_max": None, "by_environment": {}, "components": {}, "termination": {}}


def analytics_memory(session: Session) -> None:
    """Give this transaction's aggregates room to hash in memory instead of sorting on disk."""
    session.execute(text(f"SET LOCAL work_mem = '{ANALYTICS_WORK_MEM}'"))


def _points(session: Session, *, run_id: int, axis: str, since_step: int | None = None) -> dict[int, dict[str, Any]]:
    """Rewards and components by x, rewards by (x, environment), terminations by (x, reason): one pass
    (over the steps from `since_step` on, when given).

    The inner select reduces each episode to a few numbers first, so the grouping never carries JSONB."""
    keys = json_keys(session, run_id=run_id, column="reward_components")
    ended = _ended(
        select(_x(axis).label("x"), Episode.environment_id.label("env"), Episode.termination_reason.label("reason"),
               Episode.reward.label("reward"),
               *[number(Episode.reward_components, key).label(f"c{i}") for i, key in enumerate(keys)])
        .select_from(Episode), run_id=run_id, axis=axis,
    )
    if since_step is not None:
        ended = ended.where(EpisodeGroup.consumed_step >= since_step)
    rows = ended.subquery("ended")
    x, env, reason, reward = rows.c.x, rows.c.env, rows.c.reason, rows.c.reward
    query = select(
        x, env, reason, func.grouping(env, reason), func.count(), func.avg(reward), func.stddev_pop(reward),
        func.min(reward), func.max(reward), *[func.avg(rows.c[f"c{i}"]) for i in range(len(keys))],
    ).group_by(func.grouping_sets(tuple_(x), tuple_(x, env), tuple_(x, reason)))
    names = dict(session.execute(select(Environment.id, Environment.name)).all())
    analytics_memory(session)
    points: dict[int, dict[str, Any]] = {}
    for x_value, env_id, reason_value, level, count, mean, std, low, high, *means in session.execute(query):
        point = points.setdefault(x_value, _point(x_value))
        if level == 3:  # neither environment nor reason: the whole x
            point.update(episodes=count, reward_mean=_finite(mean), reward_std=_finite(std), reward_min=_finite(low),
                         reward_max=_finite(high))
            point["components"] = {key: _finite(value) for key, value in zip(keys, means, strict=True)
                                   if value is not None}
        elif level == 1:  # by environment
            point["by_environment"][names.get(env_id, str(env_id))] = _finite(mean)
        else:
            point["termination"][reason_value] = count
    return points


def _step_points(session: Session, *, run: Run) -> dict[int, dict[str, Any]]:
    """Points by training step: the final ones from STEP_POINTS, the rest from the store."""
    latest = session.execute(
        select(func.max(EpisodeGroup.consumed_step)).where(EpisodeGroup.run_id == run.id)
    ).scalar_one()
    key = (run.id, run.created_at)
    cached = STEP_POINTS.get(key)
    since = cached[0] + 1 if cached else None
    points = {**(cached[1] if cached else {}), **_points(session, run_id=run.id, axis="step", since_step=since)}
    if latest is not None:
        STEP_POINTS.put(key, final_step=latest - 1, points=points)
    return points


def metrics(session: Session, *, run_id: int) -> dict[str, Any]:
    """Training-step rows and the per-x aggregates of the run's ended episodes."""
    run = get(session, run_id=run_id)
    axis = chart_axis(session, run_id=run_id)
    steps = list(session.execute(
        select(TrainingStep).where(TrainingStep.run_id == run_id).order_by(TrainingStep.step)
    ).scalars())
    points = _step_points(session, run=run) if axis == "step" else _points(session, run_id=run_id, axis=axis)
    return {"axis": axis, "steps": steps, "points": [points[x] for x in sorted(points)]}
