"""Reconciliation: nothing dispatched is lost, nothing is retried forever.

Per active run, each pass:
- *unsent* episodes (pending with no deadline: a send failed) are sent again;
- *orphaned* episodes are lost at once, whatever their deadline: running, leased by a worker process
  (its incarnation, task_workers/heartbeat.py) that is gone — its name now beats under another
  incarnation (restarted: compose keeps the hostname), it stopped, or its heartbeat went stale;
- episodes past their deadline are judged:
    started, worker alive (fresh heartbeat)  → slow: left alone (the worker enforces the timeout);
    started, worker dead or unknown          → lost;
    never started, no live worker serves the queue   → queued: left in the broker for the next worker;
    never started, the queue is idle or has moved past it (a later-sent episode of the same
    environment is running)                  → lost (its message was never sent or was dropped);
    never started otherwise                  → queued behind earlier work;
- a lost episode gets a `worker_lost` record in `failures`, attempts + 1, and goes back to pending
  with a new deadline and a new message — or, once lost `max_attempts` times, ends as failed
  (`worker_lost`);
- episodes awaiting their judge (`scoring`) are sent again when their next ask is due (their task judges
  them from the store, never plays them), or failed `judge_error` past the run's judge_patience_s;
- groups with no pending, running or scoring episode left are marked complete — except those judged pairwise
  (`verifier.judge.mode: pairwise`), which the worker completes once their judge's scores are stored;
  one nobody judged (its last episode failed for good, the judge stayed down through every retry) gets
  one ended episode's task sent again, past its deadline: its redelivery judges the group (or, after
  group_judge.MAX_JUDGING_ATTEMPTS failed judgings, drops it: then it is not resent).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session

from controller.config import ControllerConfig
from controller.dispatch import database_now, episode_horizon, send_episodes
from controller.dispatcher import Dispatcher
from controller.logs import log_event
from controller.progress import GroupStatus
from core.models import Environment, Episode, EpisodeGroup, Run, Worker
from core.models.worker import alive
from core.schemas.episode import FailureRecord
from core.schemas.run import stored_run
from core.termination import IN_PLAY, JUDGE_RETRY_S, OUTSTANDING, EpisodeStatus, RunStatus, TerminationReason
from environments.pairwise import pairwise_environments

SOURCE = "controller"


@dataclass
class ReconcileResult:
    run_id: int
    resent: list[int] = field(default_factory=list)
    orphaned: list[int] = field(default_factory=list)
    """Running episodes whose worker process was gone: lost at once (requeued, or failed after max_attempts)."""
    failed: list[int] = field(default_factory=list)
    slow: list[int] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)
    groups_completed: int = 0
    judging_resent: list[int] = field(default_factory=list)
    """Groups judged pairwise that nobody judged: an episode's task was sent again to judge them."""
    rescoring: list[int] = field(default_factory=list)
    """Episodes awaiting their judge (`scoring`) whose next ask was due: their tasks were sent again."""
    unscored: list[int] = field(default_factory=list)
    """Episodes that waited for their judge past the run's judge_patience_s: failed `judge_error`."""


@dataclass(frozen=True)
class _Liveness:
    alive_workers: set[str]
    alive_incarnations: set[str]
    served_queues: set[str]
    busy_queues: set[str]
    """Queues with an episode running now."""
    latest_running: dict[int, datetime]
    """Per environment, the latest deadline (= latest send) among its running episodes."""


def reconcile_run(
    session: Session, *, run_id: int, dispatcher: Dispatcher, settings: ControllerConfig
) -> ReconcileResult:
    """One reconciliation pass over a run. Commits."""
    result = ReconcileResult(run_id=run_id)
    _send_unsent(session, run_id=run_id, dispatcher=dispatcher, settings=settings, result=result)
    _requeue_orphans(session, run_id=run_id, dispatcher=dispatcher, settings=settings, result=result)
    _handle_overdue(session, run_id=run_id, dispatcher=dispatcher, settings=settings, result=result)
    _rescore_waiting(session, run_id=run_id, dispatcher=dispatcher, result=result)
    result.groups_completed = complete_finished_groups(session, run_id=run_id)
    session.commit()
    _resend_unjudged(session, run_id=run_id, dispatcher=dispatcher, settings=settings, result=result)
    return result


def complete_finished_groups(session: Session, *, run_id: int) -> int:
    outstanding = (
        exists().where(Episode.group_id == EpisodeGroup.id, Episode.status.in_(OUTSTANDING)).correlate(EpisodeGroup)
    )
    done = session.execute(
        update(EpisodeGroup)
        .where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == GroupStatus.RUNNING, ~outstanding,
               EpisodeGroup.environment_id.not_in(pairwise_environments()))  # completed once judged
        .values(status=GroupStatus.COMPLETE)
        .returning(EpisodeGroup.id)
    ).scalars().all()
    return len(done)


def _resend_unjudged(
    session: Session, *, run_id: int, dispatcher: Dispatcher, settings: ControllerConfig, result: ReconcileResult
) -> None:
    """Pairwise groups whose episodes have all ended, unjudged past every episode's deadline: the latest
    episode's task is sent again with a new deadline (so at most once per horizon); the redelivered task
    finds the episode ended and judges its group (task_workers/episode/group_judge.py)."""
    ended = ~exists().where(Episode.group_id == EpisodeGroup.id, Episode.status.in_(OUTSTANDING)).correlate(EpisodeGroup)
    due = ~exists().where(Episode.group_id == EpisodeGroup.id, Episode.deadline_at >= func.now()).correlate(EpisodeGroup)
    group_ids = session.execute(
        select(EpisodeGroup.id).where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == GroupStatus.RUNNING,
                                      ended, due, EpisodeGroup.environment_id.in_(pairwise_environments()))
        .with_for_update(skip_locked=True)
    ).scalars().all()
    if not group_ids:
        return
    now = database_now(session)
    by_queue: dict[str, list[int]] = defaultdict(list)
    for group_id in group_ids:
        episode, env = session.execute(
            select(Episode, Environment).join(Environment, Environment.id == Episode.environment_id)
            .where(Episode.group_id == group_id).order_by(Episode.id.desc()).limit(1).with_for_update(of=Episode)
        ).one()
        episode.deadline_at = now + episode_horizon(env, settings)
        by_queue[env.kind].append(episode.id)
        result.judging_resent.append(group_id)
    session.commit()
    log_event("reconcile.resend_unjudged", level=logging.WARNING, run_id=run_id, groups=group_ids)
    for queue, episode_ids in by_queue.items():
        send_episodes(session, dispatcher, episode_ids=episode_ids, queue=queue)


def _rescore_waiting(session: Session, *, run_id: int, dispatcher: Dispatcher, result: ReconcileResult) -> None:
    """Episodes awaiting their judge (`scoring`: played and stored, a learned layer's server did not answer)
    whose next ask is due: sent again — the redelivered task judges them from the store
    (task_workers/episode/learned.py), never plays them — or, once they have waited past the run's
    judge_patience_s since their play ended, failed `judge_error`, unscored and never trained on. Commits."""
    rows = _locked(session, run_id, Episode.status == EpisodeStatus.SCORING, Episode.deadline_at < func.now())
    if not rows:
        return
    config = session.execute(select(Run.config).where(Run.id == run_id)).scalar_one()
    patience = timedelta(seconds=stored_run(config, run_id=run_id).judge_patience_s)
    now = database_now(session)
    by_queue: dict[str, list[int]] = defaultdict(list)
    for episode, env in rows:
        if episode.finished_at is not None and now - episode.finished_at <= patience:
            episode.deadline_at = now + timedelta(seconds=JUDGE_RETRY_S)
            by_queue[env.kind].append(episode.id)
            result.rescoring.append(episode.id)
            continue
        episode.status, episode.termination_reason = EpisodeStatus.FAILED, TerminationReason.JUDGE_ERROR
        episode.reward, episode.reward_components = None, {}
        message = (f"no judge or reward model answered within the run's judge_patience_s "
                   f"({patience.total_seconds():g} s) after the episode was played")
        episode.failures = [*episode.failures, FailureRecord(reason=TerminationReason.JUDGE_ERROR.value,
                                                             message=message, source=SOURCE).stored()]
        result.unscored.append(episode.id)
    session.commit()
    if result.unscored:
        log_event("reconcile.judge_patience_passed", level=logging.ERROR, run_id=run_id, episodes=result.unscored)
    for queue, episode_ids in by_queue.items():
        send_episodes(session, dispatcher, episode_ids=episode_ids, queue=queue)


def _send_all(
    session: Session, dispatcher: Dispatcher, by_queue: dict[str, list[int]], result: ReconcileResult
) -> None:
    for queue, episode_ids in by_queue.items():
        sent = send_episodes(session, dispatcher, episode_ids=episode_ids, queue=queue)
        result.resent.extend(episode_ids[:sent])


def _locked(session: Session, run_id: int, *conditions: Any) -> list[Any]:
    """The run's episodes meeting `conditions`, with their environments, row-locked (skipping those
    another controller pass holds), oldest first."""
    return list(session.execute(
        select(Episode, Environment)
        .join(Environment, Environment.id == Episode.environment_id)
        .where(Episode.run_id == run_id, *conditions)
        .order_by(Episode.id)
        .with_for_update(skip_locked=True, of=Episode)
    ).all())


def _fresh(settings: ControllerConfig) -> Any:
    """A worker row that is alive: not stopped, and beating within heartbeat_timeout_s."""
    return alive(settings.heartbeat_timeout_s)


def _send_unsent(
    session: Session, *, run_id: int, dispatcher: Dispatcher, settings: ControllerConfig, result: ReconcileResult
) -> None:
    rows = _locked(session, run_id, Episode.status == EpisodeStatus.PENDING, Episode.started_at.is_(None),
                   Episode.deadline_at.is_(None))
    if not rows:
        return
    now = database_now(session)
    by_queue: dict[str, list[int]] = defaultdict(list)
    for episode, env in rows:
        episode.deadline_at = now + episode_horizon(env, settings)
        by_queue[env.kind].append(episode.id)
    session.commit()
    log_event("reconcile.send_unsent", run_id=run_id, episodes=sum(len(ids) for ids in by_queue.values()))
    _send_all(session, dispatcher, by_queue, result)


def _requeue_orphans(
    session: Session, *, run_id: int, dispatcher: Dispatcher, settings: ControllerConfig, result: ReconcileResult
) -> None:
    alive = select(Worker.incarnation).where(Worker.incarnation.is_not(None), _fresh(settings))
    rows = _locked(session, run_id, Episode.status == EpisodeStatus.RUNNING, Episode.worker_incarnation.is_not(None),
                   Episode.worker_incarnation.not_in(alive))
    result.orphaned.extend(episode.id for episode, _ in rows)
    _lose(session, rows, dispatcher=dispatcher, settings=settings, result=result)


def _handle_overdue(
    session: Session, *, run_id: int, dispatcher: Dispatcher, settings: ControllerConfig, result: ReconcileResult
) -> None:
    rows = _locked(session, run_id, Episode.status.in_(IN_PLAY), Episode.deadline_at < func.now())
    if not rows:
        return
    liveness = _liveness(session, settings=settings)
    lost = []
    for episode, env in rows:
        verdict = _judge(episode, env, liveness)
        if verdict == "slow":
            result.slow.append(episode.id)
        elif verdict == "queued":
            result.queued.append(episode.id)
        else:
            lost.append((episode, env))
    _lose(session, lost, dispatcher=dispatcher, settings=settings, result=result)


def _lose(
    session: Session, rows: list[Any], *, dispatcher: Dispatcher, settings: ControllerConfig, result: ReconcileResult
) -> None:
    """Each (episode, environment) lost: requeued and sent again, or failed after max_attempts. Commits
    (the locks taken with the rows are held until then)."""
    if not rows:
        session.commit()
        return
    now = database_now(session)
    by_queue: dict[str, list[int]] = defaultdict(list)
    for episode, env in rows:
        if _requeue_or_fail(episode, now=now, horizon=episode_horizon(env, settings), settings=settings):
            by_queue[env.kind].append(episode.id)
        else:
            result.failed.append(episode.id)
    session.commit()
    _send_all(session, dispatcher, by_queue, result)


def _judge(episode: Episode, env: Environment, liveness: _Liveness) -> str:
    if episode.started_at is not None:
        if episode.worker_incarnation is not None:
            return "slow" if episode.worker_incarnation in liveness.alive_incarnations else "lost"
        return "slow" if episode.worker in liveness.alive_workers else "lost"
    if env.kind not in liveness.served_queues:
        return "queued"
    if env.kind not in liveness.busy_queues:
        return "lost"
    latest = liveness.latest_running.get(env.id)
    passed = latest is not None and episode.deadline_at is not None and latest > episode.deadline_at
    return "lost" if passed else "queued"


def _liveness(session: Session, *, settings: ControllerConfig) -> _Liveness:
    workers = session.execute(select(Worker.name, Worker.queues, Worker.incarnation).where(_fresh(settings))).all()
    live_runs = select(Run.id).where(Run.status.in_((RunStatus.PENDING, RunStatus.RUNNING, RunStatus.STOPPED)))
    running = session.execute(
        select(Environment.id, Environment.kind, func.max(Episode.deadline_at))
        .join(Environment, Environment.id == Episode.environment_id)
        .where(Episode.run_id.in_(live_runs), Episode.status == EpisodeStatus.RUNNING)
        .group_by(Environment.id, Environment.kind)
    ).all()
    return _Liveness(
        alive_workers={name for name, _, _ in workers},
        alive_incarnations={incarnation for _, _, incarnation in workers if incarnation is not None},
        served_queues={str(queue) for _, queues, _ in workers for queue in (queues or [])},
        busy_queues={kind for _, kind, _ in running},
        latest_running={env_id: latest for env_id, _, latest in running if latest is not None},
    )


def _requeue_or_fail(
    episode: Episode, *, now: datetime, horizon: timedelta, settings: ControllerConfig
) -> bool:
    """Record the loss; back to pending (True) or, after max_attempts losses, failed (False)."""
    record = FailureRecord(reason=TerminationReason.WORKER_LOST.value, worker=episode.worker, at=now.isoformat(),
                           status=episode.status, source=SOURCE, incarnation=episode.worker_incarnation)
    episode.failures = [*episode.failures, record.stored()]
    episode.attempts += 1
    losses = sum(1 for failure in FailureRecord.read_all(episode.failures) if failure.source == SOURCE)
    gave_up = losses >= settings.max_attempts
    log_event("reconcile.worker_lost", level=logging.WARNING, run_id=episode.run_id, episode_id=episode.id,
              worker=episode.worker, losses=losses, action="failed" if gave_up else "requeued")
    if gave_up:
        episode.status = EpisodeStatus.FAILED
        episode.termination_reason = TerminationReason.WORKER_LOST
        episode.finished_at = now
        return False
    episode.status = EpisodeStatus.PENDING
    episode.worker, episode.worker_incarnation, episode.started_at = None, None, None
    episode.deadline_at = now + horizon
    return True
