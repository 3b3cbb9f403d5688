"""Dispatch groups of G episodes within a run's bounds.

For an active run, groups are dispatched while all of these leave room:
    in flight (groups running)    < max_inflight_groups      (default (staleness_bound + 1) × batch)
    dispatched − replaced         < (policy_version + staleness_bound + 1) × batch_size   (train only)
    dispatched                    < max_groups                (the budget, if set)
`replaced`: groups the trainer dropped, for any reason (stale_cap included): none will be trained on, so
the groups not yet consumed keep a window of (staleness_bound + 1) × batch_size. The second line is
AReaL's admission bound: it, not a drop rule, keeps samples near the trainer's version.
Under `dispatch_order: longest_first` the groups a pass creates are sent once all are created, longest
expected task first (`tasks.episode_seconds`), so slow tasks start early in the window.
With staleness_bound 0 (sync mode) a batch is dispatched, then nothing until the trainer has consumed
it and bumped the policy version. Each group and its episodes are created in one transaction, which
commits before the tasks are sent: a failed send leaves the episodes pending (unsent) for the
reconciler, so nothing is lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from controller.canaries import canary_task_id, is_canary_group
from controller.config import ControllerConfig, stored_run_config
from controller.dispatcher import Dispatcher, send_episode
from controller.errors import NoEligibleTask
from controller.logs import log_event
from controller.picking import pick_task
from controller.progress import RunProgress, run_progress
from controller.runs import ACTIVE_STATUSES, finish_run, get_run
from core.models import Environment, Episode, EpisodeGroup, Run, Task
from core.schemas import RunConfig
from core.termination import EpisodeStatus, GroupStatus, RunPurpose, RunStatus
from environments.spec import Limits


@dataclass(frozen=True)
class Allowance:
    groups: int
    """How many more groups may be dispatched now."""
    limit: str
    """The binding bound: inflight, staleness or budget."""


@dataclass
class DispatchResult:
    run_id: int
    group_ids: list[int] = field(default_factory=list)
    limit: str = "per_pass"
    """Why dispatching stopped: a bound, per_pass, send_failed, no_eligible_task or inactive."""
    error: str | None = None


@dataclass(frozen=True)
class NewGroup:
    group_id: int
    group_index: int
    queue: str
    episode_ids: list[int]
    task_id: int = 0


def allowance(*, run: Run, config: RunConfig, progress: RunProgress) -> Allowance:
    assert config.max_inflight_groups is not None  # resolved at creation
    room = {"inflight": config.max_inflight_groups - progress.inflight}
    if run.purpose == RunPurpose.TRAIN:  # pass-rate and eval runs are never trained on: no version bound
        # Groups the trainer dropped (zero variance, failed, past the staleness cap, …) are replaced: they
        # do not count against the version bound, or dynamic sampling would starve the run and every
        # stale-cap drop would narrow the window for good. They all still count against the budget.
        useful = progress.dispatched - progress.replaced
        room["staleness"] = (run.policy_version + run.max_staleness + 1) * run.batch_size - useful
    if config.max_groups is not None:
        room["budget"] = config.max_groups - progress.dispatched
    limit = min(room, key=lambda name: room[name])
    return Allowance(groups=max(0, room[limit]), limit=limit)


def episode_horizon(env: Environment, settings: ControllerConfig) -> timedelta:
    """How long after being sent an episode may take: the environment's timeout plus slack."""
    limits = Limits.model_validate((env.spec or {}).get("limits") or {})
    return timedelta(seconds=limits.episode_timeout_s + settings.deadline_slack_s)


def database_now(session: Session) -> datetime:
    """The database clock (transaction start): every host compares deadlines against the same clock."""
    return session.execute(select(func.now())).scalar_one()


def create_group(session: Session, *, run: Run, config: RunConfig, settings: ControllerConfig) -> NewGroup:
    """Insert the next group of `run` and its G pending episodes (flushed, not committed)."""
    last = select(func.coalesce(func.max(EpisodeGroup.group_index), -1)).where(EpisodeGroup.run_id == run.id)
    index = session.execute(last).scalar_one() + 1
    pick = pick_task(session, run_id=run.id, config=config, group_index=index)
    task_id = pick.task_id
    if is_canary_group(run_id=run.id, seed=config.seed, group_index=index, rate=config.canary_rate,
                       after=config.canary_after):
        task_id = canary_task_id(session, task_id=pick.task_id) or pick.task_id
    now = database_now(session)
    group = EpisodeGroup(
        run_id=run.id, group_index=index, task_id=task_id, environment_id=pick.environment.id,
        size=run.group_size, policy_version=run.policy_version, status=GroupStatus.RUNNING,
    )
    session.add(group)
    session.flush()
    deadline = now + episode_horizon(pick.environment, settings)
    episodes = [
        Episode(run_id=run.id, group_id=group.id, sample_index=sample, task_id=task_id,
                environment_id=pick.environment.id, status=EpisodeStatus.PENDING, deadline_at=deadline)
        for sample in range(run.group_size)
    ]
    session.add_all(episodes)
    if run.status == RunStatus.PENDING:
        run.status, run.started_at = RunStatus.RUNNING, now
    session.flush()
    log_event("dispatch.group", run_id=run.id, group_id=group.id, group_index=index, task_id=task_id,
              environment=pick.environment.name, bucket=pick.bucket, policy_version=run.policy_version)
    return NewGroup(group.id, index, pick.environment.kind, [episode.id for episode in episodes], task_id)


def send_episodes(session: Session, dispatcher: Dispatcher, *, episode_ids: list[int], queue: str) -> int:
    """Send one task per episode; returns how many were sent. On a failed send the rest are marked
    unsent (no deadline) and committed so: the reconciler sends them later."""
    for position, episode_id in enumerate(episode_ids):
        try:
            send_episode(dispatcher, episode_id=episode_id, queue=queue)
        except Exception as error:  # brokers raise transport-specific errors
            unsent = episode_ids[position:]
            session.execute(
                update(Episode)
                .where(Episode.id.in_(unsent), Episode.status == EpisodeStatus.PENDING, Episode.started_at.is_(None))
                .values(deadline_at=None)
            )
            session.commit()
            log_event("dispatch.send_failed", level=logging.ERROR, queue=queue, unsent=len(unsent), error=str(error))
            return position
    return len(episode_ids)


def dispatch_run(
    session: Session, *, run_id: int, dispatcher: Dispatcher, settings: ControllerConfig
) -> DispatchResult:
    """Dispatch as many groups as the run's bounds allow (at most `max_groups_per_pass`). Commits."""
    result = DispatchResult(run_id=run_id)
    created: list[NewGroup] = []
    for _ in range(settings.max_groups_per_pass):
        run = get_run(session, run_id=run_id, lock=True)  # serialises controllers on this run
        if run.status not in ACTIVE_STATUSES:
            result.limit = "inactive"
            break
        config = stored_run_config(run)
        room = allowance(run=run, config=config, progress=run_progress(session, run_id=run_id))
        if room.groups == 0:
            result.limit = room.limit
            break
        try:
            new = create_group(session, run=run, config=config, settings=settings)
        except NoEligibleTask as error:  # the caller reports it; the run waits for eligible tasks
            session.rollback()
            result.limit, result.error = "no_eligible_task", str(error)
            break
        session.commit()
        result.group_ids.append(new.group_id)
        if config.dispatch_order == "longest_first":
            created.append(new)  # sent together once the pass has created every group it may
        elif not _send(session, dispatcher, [new]):
            result.limit = "send_failed"
            return result
    session.commit()
    if created and not _send(session, dispatcher, longest_first(session, created)):
        result.limit = "send_failed"
    return result


def longest_first(session: Session, groups: list[NewGroup]) -> list[NewGroup]:
    """The groups in order of their task's expected episode seconds, longest first; a task never
    measured first of all (it may be the longest); ties in dispatch order."""
    seconds = dict(session.execute(select(Task.id, Task.episode_seconds)
                                   .where(Task.id.in_({g.task_id for g in groups}))).all())
    return sorted(groups, key=lambda g: (seconds.get(g.task_id) is not None, -(seconds.get(g.task_id) or 0.0),
                                         g.group_index))


def _send(session: Session, dispatcher: Dispatcher, groups: list[NewGroup]) -> bool:
    """Send every group's episodes in order; on a failed send the rest, of this group and the later ones,
    are left unsent for the reconciler (send_episodes). False if a send failed."""
    for position, group in enumerate(groups):
        if send_episodes(session, dispatcher, episode_ids=group.episode_ids, queue=group.queue) < len(group.episode_ids):
            later = [episode_id for rest in groups[position + 1:] for episode_id in rest.episode_ids]
            if later:
                session.execute(update(Episode).where(Episode.id.in_(later), Episode.status == EpisodeStatus.PENDING,
                                                      Episode.started_at.is_(None)).values(deadline_at=None))
                session.commit()
            return False
    return True


def complete_run_if_done(session: Session, *, run_id: int) -> bool:
    """Mark a run completed once its budget is dispatched and every group has ended (train runs: and
    been consumed or dropped by the trainer). True if it was completed now. Locks the run row and
    flushes: the caller commits (after anything that must happen in the same transaction)."""
    run = get_run(session, run_id=run_id, lock=True)
    config = stored_run_config(run)
    if run.status not in ACTIVE_STATUSES or config.max_groups is None:
        return False
    progress = run_progress(session, run_id=run_id)
    outstanding = progress.inflight + (progress.awaiting_trainer if run.purpose == RunPurpose.TRAIN else 0)
    if progress.dispatched < config.max_groups or outstanding:
        return False
    finish_run(session, run=run)
    return True
