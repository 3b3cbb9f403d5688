"""Runs for the API: launch from a RunConfig, list (paged by id), show with summary counts, stop, resume.

Launching, stopping and resuming are the controller's (`controller.runs`); this module adds the
read side the dashboard and the CLI need.
"""

from __future__ import annotations

import math
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.pagination import decode_cursor, page
from api.schemas.runs import RunDetail, RunEnvironmentPublic, RunPublic, RunSummary
from api.services import run_health
from controller import runs as controller_runs
from core.counters import run_counts
from core.errors import ConfigError, NotFound
from core.models import Environment, Run, RunEnvironment, RunEpisodeCounts, TrainingStep
from core.schemas import RunConfig
from core.termination import EpisodeStatus


def launch(session: Session, *, config: RunConfig) -> RunPublic:
    """A pending run; an unknown environment is a bad config (422), not a missing resource (404)."""
    try:
        return RunPublic.model_validate(controller_runs.create_run(session, config=config))
    except NotFound as error:
        raise ConfigError(f"environments: {error}") from None


def stop(session: Session, *, run_id: int) -> RunPublic:
    return RunPublic.model_validate(controller_runs.stop_run(session, run_id=run_id))


def resume(session: Session, *, run_id: int) -> RunPublic:
    return RunPublic.model_validate(controller_runs.resume_run(session, run_id=run_id))


def get(session: Session, *, run_id: int) -> Run:
    """The run's row (NotFound for an unknown id), for the services that read more of it."""
    return controller_runs.get_run(session, run_id=run_id)


def list_runs(
    session: Session, *, status: str | None, purpose: str | None, cursor: str | None, limit: int
) -> tuple[list[RunPublic], str | None]:
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
    kept, next_cursor = page(rows, limit=limit, key=lambda row: [row.id])
    return [RunPublic.model_validate(row) for row in kept], next_cursor


def run_environments(session: Session, *, run_id: int) -> list[RunEnvironmentPublic]:
    query = (
        select(Environment.id, Environment.name, Environment.version, RunEnvironment.weight)
        .join(RunEnvironment, RunEnvironment.environment_id == Environment.id)
        .where(RunEnvironment.run_id == run_id).order_by(Environment.name)
    )
    return [RunEnvironmentPublic(environment_id=id_, name=name, version=version, weight=weight)
            for id_, name, version, weight in session.execute(query)]


def _std(count: int, total: float, squares: float) -> float | None:
    if count == 0:
        return None
    return math.sqrt(max(squares / count - (total / count) ** 2, 0.0))


def summary(session: Session, *, run_id: int) -> RunSummary:
    """Counts by status and termination reason, reward mean/std, tokens, turns, flags and groups: summed
    from the run's counter ledgers (`core.counters`), a few dozen rows whatever the size of the run."""
    counts = run_counts(session, run_id=run_id)
    episodes: dict[str, int] = {}
    termination: dict[str, int] = {}
    rewarded, total, squares, tokens, turns, scored, flagged = 0, Decimal(0), Decimal(0), 0, 0, 0, 0
    for (status, reason), row in counts.episodes.items():
        episodes[status] = episodes.get(status, 0) + row.episodes
        if reason is not None:
            termination[reason] = termination.get(reason, 0) + row.episodes
        if status == EpisodeStatus.COMPLETED:
            scored, flagged = scored + row.episodes, flagged + row.flagged
        rewarded, total, squares = rewarded + row.rewarded, total + row.reward_sum, squares + row.reward_squares
        tokens, turns = tokens + row.tokens, turns + row.turns
    steps, latest = session.execute(
        select(func.count(), func.max(TrainingStep.step)).where(TrainingStep.run_id == run_id)
    ).one()
    return RunSummary(
        episodes=episodes, groups=counts.groups, termination=termination,
        flagged=flagged, flagged_rate=flagged / scored if scored else None, flags=counts.flags,
        reward_mean=float(total / rewarded) if rewarded else None,
        reward_std=_std(rewarded, float(total), float(squares)),
        tokens=tokens, turns=turns, training_steps=steps, latest_step=latest,
    )


def show(session: Session, *, run_id: int) -> RunDetail:
    run = get(session, run_id=run_id)
    columns = {column.key: getattr(run, column.key) for column in Run.__table__.columns}
    return RunDetail.model_validate({**columns, "environments": run_environments(session, run_id=run_id),
                                     "summary": summary(session, run_id=run_id),
                                     "waiting_for_trainer": run_health.waiting_for_trainer(session, run=run),
                                     "tool_call_failures": run_health.tool_call_failures(session, run_id=run_id)})


def episode_counts(session: Session, *, run_ids: list[int]) -> dict[int, dict[str, int]]:
    """run id → episodes by status, for a page of runs (from the counter ledgers)."""
    if not run_ids:
        return {}
    ledger = RunEpisodeCounts.c
    total = func.sum(ledger.episodes)
    query = (select(ledger.run_id, ledger.status, total).where(ledger.run_id.in_(run_ids))
             .group_by(ledger.run_id, ledger.status).having(total != 0))
    counts: dict[int, dict[str, int]] = {run_id: {} for run_id in run_ids}
    for run_id, status, count in session.execute(query):
        counts[run_id][status] = int(count)
    return counts
