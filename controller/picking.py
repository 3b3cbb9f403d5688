"""The next task of a run, deterministic in (run seed, group index):

1. an environment, drawn by the run's environment weights;
2. a difficulty bucket (easy, medium, hard, or unknown = not measured yet), drawn by the curriculum's
   bucket weights among the buckets that hold an eligible task;
3. within it, a task least used so far in this run (coverage), ties broken by a seeded hash.

A measurement (an eval or pass-rate run) skips step 2: its groups take the least-used eligible task of
any bucket, so they cover every task of the split once before any twice.

A task is eligible when it is in the run's split and has no measured pass rate or one inside the
curriculum's band. A share of groups (`curriculum.readmit_rate`, drawn by its own seeded coin) goes to
a task outside the band instead, least used first, when there is one: the trainer's online update
measures it again, so a task the policy stopped (or started) solving comes back into the band
(its bucket reads `readmitted`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, case, func, literal, or_, select
from sqlalchemy.orm import Session

from controller.errors import NoEligibleTask
from controller.progress import run_environments
from core.models import Environment, EpisodeGroup, Task
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


def eligible(*, environment_name: str, split: str, curriculum: Curriculum) -> ColumnElement[bool]:
    low, high = curriculum.pass_rate_band
    return and_(
        Task.environment_name == environment_name,
        Task.split == split,
        or_(Task.pass_rate.is_(None), Task.pass_rate.between(low, high)),
    )


def eligible_buckets(
    session: Session, *, environment_name: str, split: str, curriculum: Curriculum
) -> dict[str, int]:
    """Eligible tasks per bucket, only buckets with a positive weight."""
    bucket = bucket_of()
    rows = session.execute(
        select(bucket, func.count())
        .where(eligible(environment_name=environment_name, split=split, curriculum=curriculum))
        .group_by(bucket)
    ).all()
    weights = _bucket_weights(curriculum)
    return {name: count for name, count in rows if count and weights.get(name, 0.0) > 0}


def check_eligible(session: Session, *, environment_name: str, split: str, curriculum: Curriculum) -> None:
    """Raise NoEligibleTask, saying why, if the environment has nothing the run may draw."""
    if eligible_buckets(session, environment_name=environment_name, split=split, curriculum=curriculum):
        return
    in_split = session.execute(
        select(func.count()).where(Task.environment_name == environment_name, Task.split == split)
    ).scalar_one()
    where = f"environment {environment_name!r} has no eligible task in split {split!r}"
    if in_split == 0:
        raise NoEligibleTask(f"{where}: the split is empty; upload tasks or choose another split")
    low, high = curriculum.pass_rate_band
    raise NoEligibleTask(
        f"{where}: of its {in_split} tasks none has a pass rate in the band [{low}, {high}] (or unmeasured) "
        f"in a bucket with positive weight (bucket_weights {dict(curriculum.bucket_weights)})"
    )


def out_of_band(*, environment_name: str, split: str, curriculum: Curriculum) -> ColumnElement[bool]:
    low, high = curriculum.pass_rate_band
    return and_(Task.environment_name == environment_name, Task.split == split, Task.pass_rate.is_not(None),
                or_(Task.pass_rate < low, Task.pass_rate > high))


def pick_task(session: Session, *, run_id: int, config: RunConfig, group_index: int) -> Pick:
    token = f"{config.seed}:{group_index}"
    rng = random.Random(token)  # str seeds are hashed with SHA-512: the same in every process
    shares = run_environments(session, run_id=run_id)
    environment = rng.choices([env for env, _ in shares], weights=[weight for _, weight in shares])[0]
    curriculum = config.curriculum
    if curriculum.readmit_rate > 0 and random.Random(f"{token}:readmit").random() < curriculum.readmit_rate:
        outside = out_of_band(environment_name=environment.name, split=config.split, curriculum=curriculum)
        task_id = _least_used_task(session, run_id=run_id, where=outside, bucket=None, token=token)
        if task_id is not None:
            return Pick(environment=environment, task_id=task_id, bucket="readmitted")
    buckets = eligible_buckets(session, environment_name=environment.name, split=config.split, curriculum=curriculum)
    if not buckets:
        check_eligible(session, environment_name=environment.name, split=config.split, curriculum=curriculum)
    if config.purpose != RunPurpose.TRAIN:  # a measurement: every eligible task once before any twice
        return _covering_pick(session, run_id=run_id, environment=environment, split=config.split,
                              curriculum=curriculum, token=token)
    names = [name for name in Bucket if name in buckets]
    weights = [_bucket_weights(curriculum)[name] for name in names]
    bucket = rng.choices(names, weights=weights)[0]
    task_id = _least_used_task(
        session, run_id=run_id, where=eligible(environment_name=environment.name, split=config.split,
                                                curriculum=curriculum), bucket=bucket, token=token,
    )
    assert task_id is not None  # the bucket holds an eligible task
    return Pick(environment=environment, task_id=task_id, bucket=bucket)


def _covering_pick(session: Session, *, run_id: int, environment: Environment, split: str, curriculum: Curriculum,
                   token: str) -> Pick:
    """The least-used eligible task of any bucket: an eval or pass-rate run's groups cover every task of the
    split once before any task twice, whatever the buckets hold (drawing a bucket first would sample a
    small bucket's tasks again before a large bucket's were all drawn)."""
    where = eligible(environment_name=environment.name, split=split, curriculum=curriculum)
    task_id = _least_used_task(session, run_id=run_id, where=where, bucket=None, token=token)
    assert task_id is not None  # check_eligible found an eligible task
    bucket = session.execute(select(bucket_of()).where(Task.id == task_id)).scalar_one()
    return Pick(environment=environment, task_id=task_id, bucket=bucket)


def _least_used_task(
    session: Session, *, run_id: int, where: ColumnElement[bool], bucket: str | None, token: str
) -> int | None:
    usage = (
        select(EpisodeGroup.task_id, func.count().label("groups"))
        .where(EpisodeGroup.run_id == run_id)
        .group_by(EpisodeGroup.task_id)
        .subquery()
    )
    query = (
        select(Task.id)
        .outerjoin(usage, usage.c.task_id == Task.id)
        .where(where, *([bucket_of() == bucket] if bucket is not None else []))
        .order_by(func.coalesce(usage.c.groups, 0), func.md5(func.concat(Task.id, ":", token)))
        .limit(1)
    )
    found = session.execute(query).scalar_one_or_none()
    return None if found is None else int(found)
