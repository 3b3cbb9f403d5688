"""The next task of a run, deterministic in (run seed, group index):

1. an environment, drawn by the run's environment weights;
2. a difficulty bucket (easy, medium, hard, or unknown = not measured yet), drawn by the curriculum's
   bucket weights among the buckets that hold an eligible task;
3. within it, a task least used so far in this run (coverage), ties broken by a seeded hash.

A measurement (an eval or pass-rate run) skips step 2: its groups take the least-used eligible task of
any bucket, so they cover every task of the split once before any twice.

A task is eligible when it is in the run's split and in the run's pass-rate band (core.models.task_rate):
the run's own rate of the task, seeded from the pass-rate job's measurement when the run first draws
from the environment and split (in the band if unmeasured or measured inside it) and moved by the run's
trainer only; it leaves the band only once the run is 95 % sure its rate is outside. A share of groups
(`curriculum.readmit_rate`, drawn by its own seeded coin) goes to a task outside the band instead, least
used first: a too-hard one while there is one, which the policy may have learnt since (the trainer's
update measures it again, and it comes back once its rate is inside the band), else a too-easy one
(its bucket reads `readmitted`).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, case, func, literal, select
from sqlalchemy.orm import Session

from controller.errors import NoEligibleTask
from controller.progress import run_environments
from core.models import Environment, EpisodeGroup, RunTaskRate, Task
from core.models.task_rate import band_membership, seed_rates
from core.schemas.run import Curriculum, RunConfig
from core.termination import MEASURED_BUCKETS, Bucket, RunPurpose


@dataclass(frozen=True)
class Pick:
    environment: Environment
    task_id: int
    bucket: str


def bucket_of() -> ColumnElement[str]:
    """A task's bucket: its difficulty label, or `unknown` when it has none (not measured yet)."""
    return case((Task.difficulty.in_(MEASURED_BUCKETS), Task.difficulty), else_=literal(Bucket.UNKNOWN.value))


def _bucket_weights(curriculum: Curriculum) -> dict[str, float]:
    return {str(name): weight for name, weight in curriculum.bucket_weights.items()}


def in_split(*, environment_name: str, split: str) -> ColumnElement[bool]:
    return and_(Task.environment_name == environment_name, Task.split == split)


def _weighted(counts: dict[str, int], curriculum: Curriculum) -> dict[str, int]:
    """The buckets that hold a task, only those with a positive weight."""
    weights = _bucket_weights(curriculum)
    return {name: count for name, count in counts.items() if count and weights.get(name, 0.0) > 0}


def eligible_buckets(
    session: Session, *, run_id: int, environment_name: str, split: str, curriculum: Curriculum
) -> dict[str, int]:
    """The run's eligible tasks per bucket, only buckets with a positive weight."""
    bucket = bucket_of()
    rows = session.execute(
        select(bucket, func.count()).select_from(Task).join(RunTaskRate, _rate_of(run_id))
        .where(in_split(environment_name=environment_name, split=split), RunTaskRate.in_band)
        .group_by(bucket)
    ).all()
    return _weighted({name: count for name, count in rows}, curriculum)


def check_eligible(session: Session, *, environment_name: str, split: str, curriculum: Curriculum) -> None:
    """Before a launch: raise NoEligibleTask, saying why, if a run would find nothing to draw in the
    environment (its rates seeded now, from the pass-rate job's measurements)."""
    rows = session.execute(select(bucket_of(), Task.pass_rate).where(
        in_split(environment_name=environment_name, split=split))).all()
    band = curriculum.pass_rate_band
    counts = Counter(bucket for bucket, rate in rows
                     if band_membership(rate=rate, samples=0.0, band=band, was_in=False))
    if not _weighted(counts, curriculum):
        raise _no_eligible(environment_name=environment_name, split=split, curriculum=curriculum, tasks=len(rows))


def _no_eligible(*, environment_name: str, split: str, curriculum: Curriculum, tasks: int) -> NoEligibleTask:
    where = f"environment {environment_name!r} has no eligible task in split {split!r}"
    if tasks == 0:
        return NoEligibleTask(f"{where}: the split is empty; upload tasks or choose another split")
    low, high = curriculum.pass_rate_band
    return NoEligibleTask(
        f"{where}: of its {tasks} tasks none has a pass rate in the band [{low}, {high}] (or unmeasured) "
        f"in a bucket with positive weight (bucket_weights {dict(curriculum.bucket_weights)})"
    )


def pick_task(session: Session, *, run_id: int, config: RunConfig, group_index: int) -> Pick:
    token = f"{config.seed}:{group_index}"
    rng = random.Random(token)  # str seeds are hashed with SHA-512: the same in every process
    shares = run_environments(session, run_id=run_id)
    environment = rng.choices([env for env, _ in shares], weights=[weight for _, weight in shares])[0]
    curriculum, split = config.curriculum, config.split
    tasks = in_split(environment_name=environment.name, split=split)
    seed_rates(session, run_id=run_id, tasks=tasks, band=curriculum.pass_rate_band)  # tasks new to the run
    if curriculum.readmit_rate > 0 and random.Random(f"{token}:readmit").random() < curriculum.readmit_rate:
        low, _ = curriculum.pass_rate_band
        task_id = _least_used_task(session, run_id=run_id, where=and_(tasks, RunTaskRate.in_band.is_(False)),
                                   bucket=None, token=token, first=RunTaskRate.rate < low)  # too hard first
        if task_id is not None:
            return Pick(environment=environment, task_id=task_id, bucket="readmitted")
    buckets = eligible_buckets(session, run_id=run_id, environment_name=environment.name, split=split,
                               curriculum=curriculum)
    if not buckets:
        count = session.execute(select(func.count()).where(tasks)).scalar_one()
        raise _no_eligible(environment_name=environment.name, split=split, curriculum=curriculum, tasks=count)
    eligible = and_(tasks, RunTaskRate.in_band)
    if config.purpose != RunPurpose.TRAIN:  # a measurement: every eligible task once before any twice
        return _covering_pick(session, run_id=run_id, environment=environment, where=eligible, token=token)
    names = [name for name in Bucket if name in buckets]
    weights = [_bucket_weights(curriculum)[name] for name in names]
    bucket = rng.choices(names, weights=weights)[0]
    task_id = _least_used_task(session, run_id=run_id, where=eligible, bucket=bucket, token=token)
    assert task_id is not None  # the bucket holds an eligible task
    return Pick(environment=environment, task_id=task_id, bucket=bucket)


def _covering_pick(session: Session, *, run_id: int, environment: Environment, where: ColumnElement[bool],
                   token: str) -> Pick:
    """The least-used eligible task of any bucket: an eval or pass-rate run's groups cover every task of the
    split once before any task twice, whatever the buckets hold (drawing a bucket first would sample a
    small bucket's tasks again before a large bucket's were all drawn)."""
    task_id = _least_used_task(session, run_id=run_id, where=where, bucket=None, token=token)
    assert task_id is not None  # eligible_buckets found an eligible task
    bucket = session.execute(select(bucket_of()).where(Task.id == task_id)).scalar_one()
    return Pick(environment=environment, task_id=task_id, bucket=bucket)


def _rate_of(run_id: int) -> ColumnElement[bool]:
    """Joins a task to the run's rate of it."""
    return and_(RunTaskRate.run_id == run_id, RunTaskRate.task_id == Task.id)


def _least_used_task(
    session: Session, *, run_id: int, where: ColumnElement[bool], bucket: str | None, token: str,
    first: ColumnElement[bool] | None = None,
) -> int | None:
    """The task matching `where` (and `bucket`) the run has drawn least, those matching `first` before
    the others; ties broken by a hash seeded with `token`. `where` may read the run's rate (RunTaskRate)."""
    usage = (
        select(EpisodeGroup.task_id, func.count().label("groups"))
        .where(EpisodeGroup.run_id == run_id)
        .group_by(EpisodeGroup.task_id)
        .subquery()
    )
    query = (
        select(Task.id)
        .join(RunTaskRate, _rate_of(run_id))
        .outerjoin(usage, usage.c.task_id == Task.id)
        .where(where, *([bucket_of() == bucket] if bucket is not None else []))
        .order_by(*([first.is_not(True)] if first is not None else []), func.coalesce(usage.c.groups, 0),
                  func.md5(func.concat(Task.id, ":", token)))
        .limit(1)
    )
    found = session.execute(query).scalar_one_or_none()
    return None if found is None else int(found)
