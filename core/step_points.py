"""The run page's points: aggregates of a run's ended episodes per training step (or per policy version
before any step) — episodes, reward mean/std/min/max, mean reward by environment, mean of each reward
component, episodes by termination reason. One computation, two callers: the trainer stores each step's
point with the step (`trainer.store.record_step`, in the step transaction), the API computes only what
was never stored (steps written before the trainer kept points, runs not trained on yet).

ONE pass over the ended episodes (`termination_reason IS NOT NULL`): GROUPING SETS give the three
groupings at once, and JSONB fields are read key by key (`col ->> 'key'`), never expanded row by row
with `jsonb_each`. The keys come from a small sample of the run's episodes (see `json_keys`). Nothing
here reads turns or token arrays. Points are JSON-safe as they are: string keys, finite floats or None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Float, Integer, Select, any_, case, cast, func, or_, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from core.models import Environment, Episode, EpisodeGroup, TrainingStep

Axis = Literal["step", "version"]
Point = dict[str, Any]
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


def finite(value: float | None) -> float | None:
    """A float JSON (and JSONB) can hold: None for NULL, NaN and ±inf."""
    return None if value is None or not math.isfinite(value) else float(value)


def analytics_memory(session: Session) -> None:
    """Give this transaction's aggregates room to hash in memory instead of sorting on disk."""
    session.execute(text(f"SET LOCAL work_mem = '{ANALYTICS_WORK_MEM}'"))


def empty_point(x: int) -> Point:
    return {"x": x, "episodes": 0, "reward_mean": None, "reward_std": None, "reward_min": None,
            "reward_max": None, "by_environment": {}, "components": {}, "termination": {}}


def _ended(*, run_id: int, axis: Axis, steps: Sequence[int] | None, keys: list[str]) -> Select[Any]:
    """The run's ended episodes that have an x (of `steps` only, when given), each reduced to a few numbers
    first, so the grouping never carries JSONB."""
    x = EpisodeGroup.consumed_step if axis == "step" else Episode.policy_version
    query = (
        select(x.label("x"), Episode.environment_id.label("env"), Episode.termination_reason.label("reason"),
               Episode.reward.label("reward"),
               *[number(Episode.reward_components, key).label(f"c{i}") for i, key in enumerate(keys)])
        .select_from(Episode)
        .where(Episode.run_id == run_id, Episode.termination_reason.is_not(None), x.is_not(None))
    )
    if axis == "step":
        query = query.join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
    if steps is not None:
        assert axis == "step", "only training steps can be selected"
        query = query.where(EpisodeGroup.consumed_step == any_(cast(list(steps), ARRAY(Integer))))
    return query


def episode_points(
    session: Session, *, run_id: int, axis: Axis, steps: Sequence[int] | None = None
) -> dict[int, Point]:
    """Points by x of the run's ended episodes (of the groups consumed at `steps` only, when given); an x
    without ended episodes has none. Rewards and components by x, rewards by (x, environment),
    terminations by (x, reason): one pass."""
    if steps is not None and not steps:
        return {}
    keys = json_keys(session, run_id=run_id, column="reward_components")
    rows = _ended(run_id=run_id, axis=axis, steps=steps, keys=keys).subquery("ended")
    x, env, reason, reward = rows.c.x, rows.c.env, rows.c.reason, rows.c.reward
    query = select(
        x, env, reason, func.grouping(env, reason), func.count(), func.avg(reward), func.stddev_pop(reward),
        func.min(reward), func.max(reward), *[func.avg(rows.c[f"c{i}"]) for i in range(len(keys))],
    ).group_by(func.grouping_sets(tuple_(x), tuple_(x, env), tuple_(x, reason)))
    names = dict(session.execute(select(Environment.id, Environment.name)).all())
    analytics_memory(session)
    points: dict[int, Point] = {}
    for x_value, env_id, reason_value, level, count, mean, std, low, high, *means in session.execute(query):
        point = points.setdefault(x_value, empty_point(x_value))
        if level == 3:  # neither environment nor reason: the whole x
            point.update(episodes=count, reward_mean=finite(mean), reward_std=finite(std), reward_min=finite(low),
                         reward_max=finite(high))
            point["components"] = {key: finite(value) for key, value in zip(keys, means, strict=True)
                                   if value is not None}
        elif level == 1:  # by environment
            point["by_environment"][names.get(env_id, str(env_id))] = finite(mean)
        else:
            point["termination"][reason_value] = count
    return points


def step_point(session: Session, *, run_id: int, step: int) -> Point:
    """The point of one training step: the ended episodes of the groups consumed at `step` (mark them
    consumed first, in the same transaction); `episodes` 0 when there are none."""
    return episode_points(session, run_id=run_id, axis="step", steps=[step]).get(step, empty_point(step))


def backfill_points(session: Session, *, run_id: int | None = None) -> dict[int, int]:
    """Store the point of every training step that has none (of `run_id`, else of every run): steps
    recorded before the trainer kept points (migration 0008), which the run page would otherwise compute
    from their episodes on every view. Computed as the trainer computes them, one pass per run; a step
    that trained on no ended episode gets the empty point, as the trainer gives it. Returns the steps
    filled per run. The caller commits."""
    unset = or_(TrainingStep.points.is_(None), func.jsonb_typeof(TrainingStep.points) == "null")  # SQL or JSON null
    query = select(TrainingStep.run_id, TrainingStep.id, TrainingStep.step).where(unset)
    if run_id is not None:
        query = query.where(TrainingStep.run_id == run_id)
    missing: dict[int, list[tuple[int, int]]] = {}
    for run, step_id, step in session.execute(query.order_by(TrainingStep.run_id, TrainingStep.step)):
        missing.setdefault(run, []).append((step_id, step))
    for run, steps in missing.items():
        points = episode_points(session, run_id=run, axis="step", steps=[step for _, step in steps])
        session.execute(update(TrainingStep), [{"id": step_id, "points": points.get(step, empty_point(step))}
                                               for step_id, step in steps])
    return {run: len(steps) for run, steps in missing.items()}
