"""Runs for the API: launch from a RunConfig, list (paged by id), show with summary counts, stop, resume.

Launching, stopping and resuming are the controller's (`controller.runs`); this module adds the
read side the dashboard and the CLI need.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.pagination import decode_cursor, page
from api.services import run_health
from controller import runs as controller_runs
from core.errors import ConfigError, NotFound
from core.models import Environment, Episode, EpisodeGroup, Run, RunEnvironment, TrainingStep
from core.schemas import RunConfig
from core.termination import EpisodeStatus


def launch(session: Session, *, config: RunConfig) -> Run:
    """A pending run; an unknown environment is a bad config (422), not a missing resource (404)."""
    try:
        return controller_runs.create_run(session, config=config)
    except NotFound as error:
        raise ConfigError(f"environments: {error}") from None


def stop(session: Session, *, run_id: int) -> Run:
    return controller_runs.stop_run(session, run_id=run_id)


def resume(session: Session, *, run_id: int) -> Run:
    return controller_runs.resume_run(session, run_id=run_id)


def get(session: Session, *, run_id: int) -> Run:
    return controller_runs.get_run(session, run_id=run_id)


def list_runs(
    session: Session, *, status: str | None, purpose: str | None, cursor: str | None, limit: int
) -> tuple[list[Run], str | None]:
    """Newest first."""
    after = decode_cursor(cursor, types=[int])
    query = select(Run).order_by(Run.id.desc())
    if status is not None:
        query = query.where(Run.status == status)
    if purpose is not None:
        query = query.where(Run.purpose == purpose)
    if after is not None:
        query = query.where(Run.id < after[0])
    rows = list(session.execute(query.limit(limit + 1)).scalars())
    return page(rows, limit=limit, key=lambda row: [row.id])


def run_environments(session: Session, *, run_id: int) -> list[dict[str, Any]]:
    query = (
        select(Environment.id, Environment.name, Environment.version, RunEnvironment.weight)
        .join(RunEnvironment, RunEnvironment.environment_id == Environment.id)
        .where(RunEnvironment.run_id == run_id).order_by(Environment.name)
    )
    return [{"environment_id": id_, "name": name, "version": version, "weight": weight}
            for id_, name, version, weight in session.execute(query)]


def _std(count: int, total: float, squares: float) -> float | None:
    if count == 0:
        return None
    return math.sqrt(max(squares / count - (total / count) ** 2, 0.0))


def summary(session: Session, *, run_id: int) -> dict[str, Any]:
    """Counts by status and termination reason, reward mean/std, tokens and turns: one pass over episodes."""
    query = (
        select(Episode.status, Episode.termination_reason, func.count(), func.count(Episode.reward),
               func.coalesce(func.sum(Episode.reward), 0.0), func.coalesce(func.sum(Episode.reward * Episode.reward), 0.0),
               func.coalesce(func.sum(Episode.num_tokens), 0), func.coalesce(func.sum(Episode.num_turns), 0),
               func.count().filter(func.cardinality(Episode.flags) > 0))
        .where(Episode.run_id == run_id).group_by(Episode.status, Episode.termination_reason)
    )
    episodes: dict[str, int] = {}
    termination: dict[str, int] = {}
    rewarded, total, squares, tokens, turns, scored, flagged = 0, 0.0, 0.0, 0, 0, 0, 0
    for status, reason, count, n_reward, r_sum, r_squares, n_tokens, n_turns, n_flagged in session.execute(query):
        episodes[status] = episodes.get(status, 0) + count
        if reason is not None:
            termination[reason] = termination.get(reason, 0) + count
        if status == EpisodeStatus.COMPLETED:
            scored, flagged = scored + count, flagged + n_flagged
        rewarded, total, squares = rewarded + n_reward, total + float(r_sum or 0.0), squares + float(r_squares or 0.0)
        tokens, turns = tokens + int(n_tokens), turns + int(n_turns)
    groups = dict(session.execute(
        select(EpisodeGroup.status, func.count()).where(EpisodeGroup.run_id == run_id).group_by(EpisodeGroup.status)
    ).all())
    steps, latest = session.execute(
        select(func.count(), func.max(TrainingStep.step)).where(TrainingStep.run_id == run_id)
    ).one()
    return {
        "episodes": episodes, "groups": groups, "termination": termination,
        "flagged": flagged, "flagged_rate": flagged / scored if scored else None,
        "flags": flag_counts(session, run_id=run_id),
        "reward_mean": total / rewarded if rewarded else None, "reward_std": _std(rewarded, total, squares),
        "tokens": tokens, "turns": turns, "training_steps": steps, "latest_step": latest,
    }


def flag_counts(session: Session, *, run_id: int) -> dict[str, int]:
    """Flagged episodes of the run by flag (only flagged rows are unnested)."""
    flagged = (select(func.unnest(Episode.flags).label("flag"))
               .where(Episode.run_id == run_id, func.cardinality(Episode.flags) > 0).subquery())
    query = select(flagged.c.flag, func.count()).group_by(flagged.c.flag).order_by(flagged.c.flag)
    return {str(name): int(count) for name, count in session.execute(query)}


def show(session: Session, *, run_id: int) -> dict[str, Any]:
    run = get(session, run_id=run_id)
    columns = {column.key: getattr(run, column.key) for column in Run.__table__.columns}
    return {**columns, "environments": run_environments(session, run_id=run_id),
            "summary": summary(session, run_id=run_id),
            "waiting_for_trainer": run_health.waiting_for_trainer(session, run=run)}


def episode_counts(session: Session, *, run_ids: list[int]) -> dict[int, dict[str, int]]:
    """run id → episodes by status, for a page of runs (one index-only pass per run)."""
    if not run_ids:
        return {}
    query = select(Episode.run_id, Episode.status, func.count()).where(Episode.run_id.in_(run_ids))
    counts: dict[int, dict[str, int]] = {run_id: {} for run_id in run_ids}
    for run_id, status, count in session.execute(query.group_by(Episode.run_id, Episode.status)):
        counts[run_id][status] = count
    return counts
