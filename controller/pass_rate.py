"""Pass-rate jobs: sample every task of a split N times, then store each task's pass rate and
difficulty bucket, which the curriculum filters and draws by: each training run seeds its own rate of
the task from the measurement (core.models.task_rate) and moves only that one.

    run = launch_pass_rate_job(session, environment="fix-bugs", split="train", samples_per_task=8,
                               model="/models/tiny")
    # … the controller dispatches one group of N per task; when all are complete it calls:
    record_pass_rates(session, run_id=run.id)

Only episodes with the agent's own outcome count: infrastructure faults say nothing about the task.
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.config import job_config
from controller.errors import InvalidRunState
from controller.logs import log_event
from controller.picking import check_eligible
from controller.progress import run_progress
from controller.runs import create_run, get_run
from core.models import Episode, EpisodeGroup, Run, Task
from core.schemas import EnvironmentShare, RunConfig
from core.schemas.run import Curriculum, SuccessRule
from core.termination import MEASURED_BUCKETS, Bucket, EpisodeStatus, RunPurpose, TerminationReason

EVERY_TASK = Curriculum(pass_rate_band=(0.0, 1.0), bucket_weights=dict.fromkeys(Bucket, 1.0))


@dataclass(frozen=True)
class DifficultyThresholds:
    easy_at: float = 0.7
    """A pass rate at or above this is easy."""
    hard_below: float = 0.3
    """A pass rate below this is hard; between the two, medium."""

    def bucket(self, pass_rate: float) -> Bucket:
        if pass_rate >= self.easy_at:
            return Bucket.EASY
        return Bucket.HARD if pass_rate < self.hard_below else Bucket.MEDIUM


@dataclass(frozen=True)
class TaskPassRate:
    task_id: int
    samples: int
    successes: int
    pass_rate: float
    difficulty: str
    policy_version: int


def launch_pass_rate_job(
    session: Session, *, environment: str, samples_per_task: int, model: str, split: str = "train",
    version: int | None = None, name: str | None = None, success_threshold: float = 1.0,
    component: str | None = None, thresholds: DifficultyThresholds | None = None, max_inflight_groups: int = 16,
) -> Run:
    """A run of purpose `pass_rate`: one group of `samples_per_task` episodes per task of the split.

    Success is `reward >= success_threshold`, or the named reward component's score (e.g.
    `hidden_tests`) when `component` is given.
    """
    check_eligible(session, environment_name=environment, split=split, curriculum=EVERY_TASK)
    tasks = session.execute(
        select(func.count()).where(Task.environment_name == environment, Task.split == split)
    ).scalar_one()
    thresholds = thresholds or DifficultyThresholds()
    default_name = re.sub(r"[^A-Za-z0-9._-]", "-", f"pass-rate-{environment}-{split}")[:110]
    config = RunConfig(
        name=name or f"{default_name}-{uuid.uuid4().hex[:8]}", model=model, purpose=RunPurpose.PASS_RATE, split=split,
        environments=[EnvironmentShare(name=environment, version=version)], group_size=samples_per_task,
        batch_size=1, max_groups=tasks, max_inflight_groups=min(tasks, max_inflight_groups), curriculum=EVERY_TASK,
    )
    job = {"kind": "pass_rate", "success_threshold": success_threshold, "component": component,
           "easy_at": thresholds.easy_at, "hard_below": thresholds.hard_below}
    return create_run(session, config=config, job=job)


def record_job_pass_rates(session: Session, *, run_id: int) -> list[TaskPassRate]:
    """`record_pass_rates` with the threshold, component and buckets the job was launched with."""
    job = job_config(get_run(session, run_id=run_id))
    thresholds = DifficultyThresholds(easy_at=job.get("easy_at", 0.7), hard_below=job.get("hard_below", 0.3))
    return record_pass_rates(session, run_id=run_id, success_threshold=job.get("success_threshold", 1.0),
                             component=job.get("component"), thresholds=thresholds)


def record_pass_rates(
    session: Session, *, run_id: int, success_threshold: float = 1.0, component: str | None = None,
    thresholds: DifficultyThresholds | None = None,
) -> list[TaskPassRate]:
    """Store pass_rate, pass_rate_samples, pass_rate_policy_version and difficulty on every task the
    pass-rate run sampled. Tasks with no countable episode are left as they were. Flushes."""
    run = get_run(session, run_id=run_id)
    if run.purpose != RunPurpose.PASS_RATE:
        raise InvalidRunState(f"run {run_id} has purpose {run.purpose!r}; expected a 'pass_rate' run")
    running = run_progress(session, run_id=run_id).inflight
    if running:
        raise InvalidRunState(f"run {run_id} has {running} groups still running; record pass rates once all are complete")
    thresholds = thresholds or DifficultyThresholds()
    rule = SuccessRule(threshold=success_threshold, component=component).model_dump()
    results = [
        _store(session, task_id=task_id, outcomes=outcomes, thresholds=thresholds, rule=rule)
        for task_id, outcomes in sorted(_outcomes(session, run_id, success_threshold, component).items())
    ]
    session.flush()
    log_event("pass_rate.recorded", run_id=run_id, tasks=len(results),
              buckets={b: sum(r.difficulty == b for r in results) for b in MEASURED_BUCKETS})
    return results


def _succeeded(episode: Episode, success_threshold: float, component: str | None) -> bool:
    return SuccessRule(threshold=success_threshold, component=component).passed(
        episode.reward, episode.reward_components, tuple(episode.flags or ()))


def _countable(episode: Episode) -> bool:
    if episode.status != EpisodeStatus.COMPLETED:
        return False
    return episode.termination_reason is None or TerminationReason(episode.termination_reason).is_trainable


def _outcomes(
    session: Session, run_id: int, success_threshold: float, component: str | None
) -> dict[int, list[tuple[bool, int]]]:
    """Per task: (succeeded, policy version) of every countable episode."""
    rows = session.execute(
        select(Episode, EpisodeGroup.policy_version)
        .join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
        .where(Episode.run_id == run_id)
    ).all()
    outcomes: dict[int, list[tuple[bool, int]]] = defaultdict(list)
    for episode, group_version in rows:
        if _countable(episode):
            version = episode.policy_version if episode.policy_version is not None else group_version
            outcomes[episode.task_id].append((_succeeded(episode, success_threshold, component), version))
    return outcomes


def _store(
    session: Session, *, task_id: int, outcomes: list[tuple[bool, int]], thresholds: DifficultyThresholds,
    rule: dict[str, Any],
) -> TaskPassRate:
    successes = sum(1 for ok, _ in outcomes if ok)
    rate = successes / len(outcomes)
    result = TaskPassRate(task_id=task_id, samples=len(outcomes), successes=successes, pass_rate=rate,
                          difficulty=thresholds.bucket(rate), policy_version=max(v for _, v in outcomes))
    task = session.get(Task, task_id)
    assert task is not None  # foreign key
    task.pass_rate, task.pass_rate_samples = result.pass_rate, result.samples
    task.pass_rate_policy_version, task.difficulty = result.policy_version, result.difficulty
    task.pass_rate_rule = rule
    return result
