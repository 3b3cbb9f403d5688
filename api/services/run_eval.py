"""An evaluation's report: pass@1 and pass@k with 95 % intervals over tasks, overall, per environment and
per difficulty bucket, from the run's ended episodes (any run; an `eval` run is the one it is made for).

Counted: episodes that ended with the agent's own outcome (`completed`); solved: reward at or above
environments.rewards.SOLVED_AT. Episodes ended by an infrastructure fault (`failed`) are reported as
excluded, never as failures of the policy. Intervals resample tasks (core.stats), since the k samples of
one task are not independent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.schemas.evals import CheckpointComparison, CheckpointEval, EvalCell, EvalReport, RateEstimate
from controller.config import stored_run_config
from controller.runs import get_run
from core.models import Environment, Episode, Run, Task
from core.stats import RESAMPLES, task_rate
from core.termination import OUTSTANDING, Bucket, EpisodeStatus, RunPurpose
from environments.rewards import SOLVED_AT

METHOD = (f"pass@k: the unbiased estimator 1 − C(n−c, k)/C(n, k) per task (Chen et al. 2021), averaged over "
          f"tasks; 95 % interval: percentile bootstrap over tasks ({RESAMPLES} resamples, seed 0); solved: reward "
          f"≥ {SOLVED_AT:g}; counted: episodes with status completed (failed ones are excluded)")

MAX_CHECKPOINT_EVALS = 200
"""The most eval runs `checkpoint_evals` reports for one training run (the newest, shown by step)."""

TaskCounts = tuple[int, int, int]
"""(counted episodes n, solved c, excluded) of one task."""


class TaskRow(NamedTuple):
    """One task's episodes in a run, counted and solved as METHOD says."""

    task_id: int
    environment: str
    difficulty: str | None
    counted: int
    solved: int
    excluded: int
    unfinished: int


def task_counts(session: Session, *, run_id: int) -> list[TaskRow]:
    """Per task of run `run_id`, by task id: what every report of the run groups (eval_report by environment
    and difficulty, recipes.browser_rl.by_page by page)."""
    ended = Episode.status == EpisodeStatus.COMPLETED
    return [TaskRow(*row) for row in session.execute(
        select(Episode.task_id, Environment.name, Task.difficulty,
               func.count().filter(ended),
               func.count().filter(ended, Episode.reward >= SOLVED_AT),
               func.count().filter(Episode.status == EpisodeStatus.FAILED),
               func.count().filter(Episode.status.in_(OUTSTANDING)))
        .join(Environment, Environment.id == Episode.environment_id).join(Task, Task.id == Episode.task_id)
        .where(Episode.run_id == run_id)
        .group_by(Episode.task_id, Environment.name, Task.difficulty)
        .order_by(Episode.task_id)
    )]


def eval_report(session: Session, *, run_id: int) -> EvalReport:
    run = get_run(session, run_id=run_id)
    config = stored_run_config(run)
    k = run.group_size
    rows = task_counts(session, run_id=run_id)
    by_environment: dict[str, list[TaskCounts]] = defaultdict(list)
    by_bucket: dict[str, list[TaskCounts]] = defaultdict(list)
    every: list[TaskCounts] = []
    for row in rows:
        counts = (int(row.counted), int(row.solved), int(row.excluded))
        every.append(counts)
        by_environment[row.environment].append(counts)
        by_bucket[row.difficulty or Bucket.UNKNOWN].append(counts)
    return EvalReport(
        run_id=run.id, purpose=run.purpose, status=run.status, model=run.model, split=config.split, k=k,
        checkpoint=config.checkpoint,
        environments=[share.name for share in config.environments],
        unfinished=sum(int(row.unfinished) for row in rows), overall=_cell(every, k=k),
        by_environment={name: _cell(tasks, k=k) for name, tasks in sorted(by_environment.items())},
        by_bucket={bucket.value: _cell(by_bucket[bucket], k=k) for bucket in Bucket if bucket in by_bucket},
        method=METHOD,
    )


def checkpoint_evals(session: Session, *, run_id: int) -> CheckpointComparison:
    """The reports of the eval runs of training run `run_id`'s checkpoints (NotFound for an unknown run)."""
    get_run(session, run_id=run_id)
    evals = session.execute(
        select(Run.id).where(Run.purpose == RunPurpose.EVAL, Run.config.contains({"checkpoint": {"run_id": run_id}}))
        .order_by(Run.id.desc()).limit(MAX_CHECKPOINT_EVALS)
    ).scalars().all()
    reports = [eval_report(session, run_id=eval_id) for eval_id in evals]
    points = [CheckpointEval(step=report.checkpoint.step, version=report.checkpoint.version, report=report)
              for report in reports if report.checkpoint is not None]
    return CheckpointComparison(run_id=run_id, evals=sorted(points, key=lambda point: (point.step, point.report.run_id)))


def _cell(tasks: Iterable[TaskCounts], *, k: int) -> EvalCell:
    tasks = list(tasks)
    counted = [(n, c) for n, c, _ in tasks if n > 0]
    with_k = [(n, c) for n, c in counted if n >= k]
    return EvalCell(
        tasks=len(counted), episodes=sum(n for n, _ in counted), solved=sum(c for _, c in counted),
        excluded=sum(x for _, _, x in tasks),
        pass_at_1=_estimate(counted, k=1), pass_at_k=_estimate(with_k, k=k) if k > 1 else None,
    )


def _estimate(tasks: list[tuple[int, int]], *, k: int) -> RateEstimate | None:
    if not tasks:
        return None
    estimate = task_rate(tasks, k)
    return RateEstimate(value=estimate.value, low=estimate.low, high=estimate.high, tasks=estimate.units)
