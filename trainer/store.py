"""The trainer's reads and writes of the store; each says which transaction it belongs to.

Exactly-once consumption: a step claims complete groups with `SELECT … FOR UPDATE SKIP LOCKED` in
its step transaction and keeps the row locks while it trains. Only after the optimizer step (and
the checkpoint, written as pending) does the same transaction mark them consumed and insert the
training_steps row, then commit. A trainer killed before the commit loses its connection, Postgres
rolls the transaction back and releases the locks: the groups are `complete` again and the next
trainer claims them. A second trainer never sees locked rows (SKIP LOCKED); it does not even start:
one trainer per run, held by a Postgres advisory lock (`hold_trainer_lock`).

The step transaction also stores what the trainer used per episode (its advantage and its reward
after shaping and normalisation: the API shows exactly these) and moves the run's own pass rate of
each examined task towards what the current policy scored (discounted counts), so the curriculum's
pass-rate band follows the policy being trained.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, select, text, update
from sqlalchemy.orm import Session

from core.db import TRAINER_LOCK_NAMESPACE, lost_connection
from core.models import Episode, EpisodeGroup, PolicyVersion, Run, RunTaskRate, Task, TrainingStep
from core.models.task_rate import seed_rates
from core.schemas.run import Curriculum, SuccessRule
from core.step_points import empty_point, step_point
from core.termination import DropReason, GroupStatus, RunStatus
from trainer.errors import TrainerAlreadyRunning

COMPLETE, CONSUMED, DROPPED, RUNNING = (GroupStatus.COMPLETE, GroupStatus.CONSUMED, GroupStatus.DROPPED,
                                        GroupStatus.RUNNING)


@dataclass(frozen=True)
class PassOutcome:
    """One scored rollout, as the online pass-rate update reads it."""

    task_id: int
    reward: float
    components: dict[str, float]
    policy_version: int
    seconds: float | None = None
    """The episode's wall-clock seconds (moves tasks.episode_seconds the same way)."""
    flags: tuple[str, ...] = ()
    """What the hack monitors saw: a flagged rollout never counts as a pass."""


@dataclass(frozen=True)
class TrainedValue:
    """What a step used for one episode."""

    episode_id: int
    advantage: float
    score: float
    """The reward after shaping and normalisation: the advantage is computed from it."""


class TrainerLock:
    """The run's trainer lock: a session-level Postgres advisory lock on a connection of its own. A
    killed trainer's connection drops and Postgres releases the lock; `release` gives it up (and
    never returns a connection still holding it to the pool). A connection cut under a live trainer
    (a database restart, a terminated backend) releases it too: `ensure` takes it again on a new
    connection, or raises TrainerAlreadyRunning if another trainer took it meanwhile."""

    def __init__(self, engine: Engine, connection: Connection, *, run_id: int) -> None:
        self.engine, self.connection, self.run_id = engine, connection, run_id

    def ensure(self) -> bool:
        """Hold the lock, taking it again if its connection was lost; True if it had to. Raises what
        the database raises while it cannot be reached (the caller retries)."""
        if not self.connection.closed:  # closed: an earlier try to take it again failed
            try:
                self.connection.execute(text("SELECT 1"))
                self.connection.commit()
                return False
            except Exception as error:
                if not lost_connection(error):
                    raise
            self.connection.invalidate()
            self.connection.close()
        self.connection = _take(self.engine, run_id=self.run_id)
        return True

    def release(self) -> None:
        if self.connection.closed:
            return
        try:
            self.connection.execute(text("SELECT pg_advisory_unlock(:namespace, :run)"),
                                    {"namespace": TRAINER_LOCK_NAMESPACE, "run": self.run_id})
            self.connection.commit()
        except Exception:
            self.connection.invalidate()  # the server ends that session, and its lock with it
        self.connection.close()


def hold_trainer_lock(engine: Engine, *, run_id: int) -> TrainerLock:
    """Take the run's trainer lock; TrainerAlreadyRunning if another trainer holds it."""
    return TrainerLock(engine, _take(engine, run_id=run_id), run_id=run_id)


def _take(engine: Engine, *, run_id: int) -> Connection:
    connection = engine.connect()
    try:
        taken = connection.execute(text("SELECT pg_try_advisory_lock(:namespace, :run)"),
                                   {"namespace": TRAINER_LOCK_NAMESPACE, "run": run_id}).scalar_one()
        connection.commit()
        if not taken:
            holder = connection.execute(text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = :namespace AND objid = :run "
                "AND granted"), {"namespace": TRAINER_LOCK_NAMESPACE, "run": run_id}).scalar()
            raise TrainerAlreadyRunning(
                f"run {run_id}: another trainer is already training it (database backend pid {holder}); expected "
                "one trainer per run — stop the other one first")
    except BaseException:
        connection.close()
        raise
    return connection


def get_run(session: Session, *, run_id: int) -> Run:
    run = session.execute(
        select(Run).where(Run.id == run_id).execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if run is None:
        from core.errors import NotFound

        raise NotFound(f"no run with id {run_id}; `crucible run ls` lists the runs")
    return run


def claim_complete_groups(session: Session, *, run_id: int, limit: int) -> list[EpisodeGroup]:
    """Lock up to `limit` complete groups of the run, oldest first, skipping any another
    transaction holds. The locks last until this session commits or rolls back."""
    query = (
        select(EpisodeGroup)
        .where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == COMPLETE)
        .order_by(EpisodeGroup.group_index)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(session.execute(query).scalars())


def inflight_groups(session: Session, *, run_id: int) -> int:
    """Groups dispatched whose episodes have not all ended."""
    query = select(func.count()).where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == RUNNING)
    return int(session.execute(query).scalar_one())


def complete_groups_besides(session: Session, *, run_id: int, claimed: set[int]) -> int:
    """Complete groups of the run outside `claimed`, locked by another transaction or not: a batch is
    not the last while one is left (a claim skips a locked row; the row is still to be trained)."""
    query = select(func.count()).where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == COMPLETE)
    if claimed:
        query = query.where(EpisodeGroup.id.not_in(claimed))
    return int(session.execute(query).scalar_one())


def nothing_more_to_come(session: Session, *, run_id: int, claimed: set[int]) -> bool:
    """Whether a batch of `claimed` (group ids) is the run's last: nothing runs, the controller may
    dispatch no more, and no complete group is left outside it (not even one another transaction holds)."""
    return inflight_groups(session, run_id=run_id) == 0 and not more_groups_possible(
        session, run_id=run_id) and complete_groups_besides(session, run_id=run_id, claimed=claimed) == 0


def oldest_waiting_version(session: Session, *, run_id: int, batch: set[int]) -> int | None:
    """The dispatch version of the oldest group a step on `batch` (group ids) would leave behind: still
    running, or complete but not in the batch (it completed after the claim). None: there is none."""
    query = select(func.min(EpisodeGroup.policy_version)).where(
        EpisodeGroup.run_id == run_id, EpisodeGroup.status.in_((RUNNING, COMPLETE)))
    if batch:
        query = query.where(EpisodeGroup.id.not_in(batch))
    found = session.execute(query).scalar_one()
    return None if found is None else int(found)


def more_groups_possible(session: Session, *, run_id: int) -> bool:
    """Whether the controller may still dispatch groups for the run: it is active and its budget
    (`max_groups` in its config, counting every group dispatched) is not spent."""
    run = get_run(session, run_id=run_id)
    if run.status not in (RunStatus.PENDING, RunStatus.RUNNING):
        return False
    budget = (run.config or {}).get("max_groups")
    if budget is None:
        return True
    dispatched = session.execute(select(func.count()).where(EpisodeGroup.run_id == run_id)).scalar_one()
    return int(dispatched) < int(budget)


def mark_dropped(session: Session, *, dropped: dict[int, str], step: int) -> None:
    """Groups that will never be trained on, each with its reason (core.termination.DropReason) and the
    step that decided it (the trainer's version then); flushed."""
    by_reason: dict[str, list[int]] = defaultdict(list)
    for group_id, reason in dropped.items():
        by_reason[DropReason(reason)].append(group_id)
    for reason, group_ids in by_reason.items():
        session.execute(
            update(EpisodeGroup).where(EpisodeGroup.id.in_(group_ids), EpisodeGroup.status == COMPLETE)
            .values(status=DROPPED, drop_reason=reason, dropped_step=step)
        )


def record_step(
    session: Session, *, run_id: int, step: int, policy_version: int, consumed: list[int], dropped: dict[int, str],
    metrics: dict[str, Any], trained: list[TrainedValue] | None = None,
) -> None:
    """In the step transaction, after the optimizer step: consume the batch's groups, drop the
    rejected ones, store each trained episode's advantage and score, and insert the step's metrics
    and its run-page point (`core.step_points`). Flushed; the caller commits.

    `policy_version` is the version this step produces (published once the sync is verified).
    """
    if consumed:
        done = session.execute(
            update(EpisodeGroup).where(EpisodeGroup.id.in_(consumed), EpisodeGroup.status == COMPLETE)
            .values(status=CONSUMED, consumed_step=step)
        )
        if done.rowcount != len(consumed):  # type: ignore[attr-defined]
            raise RuntimeError(f"step {step}: expected to consume {len(consumed)} complete groups, "
                               f"got {done.rowcount}")  # type: ignore[attr-defined]
    mark_dropped(session, dropped=dropped, step=step - 1)
    if trained:
        session.execute(update(Episode), [
            {"id": value.episode_id, "advantage": value.advantage, "trained_score": value.score} for value in trained])
    # The run page's point of this step, from the groups just marked consumed: read with the step row.
    points = step_point(session, run_id=run_id, step=step) if consumed else empty_point(step)
    session.add(TrainingStep(run_id=run_id, step=step, policy_version=policy_version, metrics=metrics,
                             points=points))
    session.flush()


def last_step(session: Session, *, run_id: int) -> int:
    """The highest recorded training step of the run (0 before the first)."""
    query = select(func.coalesce(func.max(TrainingStep.step), 0)).where(TrainingStep.run_id == run_id)
    return int(session.execute(query).scalar_one())


def consumed_groups(session: Session, *, run_id: int, through_step: int) -> int:
    query = select(func.count()).where(
        EpisodeGroup.run_id == run_id, EpisodeGroup.status == CONSUMED, EpisodeGroup.consumed_step <= through_step
    )
    return int(session.execute(query).scalar_one())


def publish_version(
    session: Session, *, run_id: int, version: int, step: int, checkpoint_path: str | None, sync_seconds: float,
    probe_kl: float,
) -> None:
    """After a verified sync: record the version and make it the run's current one. Flushed.

    Idempotent: publishing a version the run already has changes nothing."""
    run = session.execute(select(Run).where(Run.id == run_id).with_for_update()).scalar_one()
    if run.policy_version >= version:
        return
    if version != run.policy_version + 1:
        raise RuntimeError(f"expected to publish version {run.policy_version + 1}, got {version}")
    session.add(PolicyVersion(run_id=run_id, version=version, training_step=step, checkpoint_path=checkpoint_path,
                              sync_seconds=sync_seconds, probe_kl=probe_kl))
    run.policy_version = version
    session.flush()


def update_pass_rates(
    session: Session, *, run_id: int, curriculum: Curriculum, outcomes: list[PassOutcome],
) -> dict[int, float]:
    """Count each examined task's rollouts in the run's own rate of it (RunTaskRate.observe: the counts
    so far discounted by 1 − `curriculum.pass_rate_update` at each step that examines the task; band
    membership on a confidence bound). No run moves `tasks.pass_rate`: the pass-rate job's measurement,
    which seeds each run's rate. A pass is counted by the rule the task was measured with
    (`tasks.pass_rate_rule`), else by `curriculum.success`: a judge-scored task whose rewards never
    reach 1 must not drift to 0. `outcomes`: every scored rollout of the groups examined. The task's
    episode seconds (shared by runs: a dispatch-order hint) move by an exponential average of the same
    weight. Returns the run's new rates by task id. Flushed; in the step transaction."""
    by_task: dict[int, list[PassOutcome]] = defaultdict(list)
    for outcome in outcomes:
        by_task[outcome.task_id].append(outcome)
    weight, band = curriculum.pass_rate_update, curriculum.pass_rate_band
    if weight <= 0 or not by_task:
        return {}
    seed_rates(session, run_id=run_id, tasks=Task.id.in_(by_task), band=band)  # a run from before migration 0013
    # NO KEY UPDATE: a controller inserting a group or a rate row of these tasks (a foreign key) never waits.
    tasks = {task.id: task for task in session.execute(
        select(Task).where(Task.id.in_(by_task)).order_by(Task.id).with_for_update(key_share=True)).scalars()}
    own = session.execute(select(RunTaskRate).where(RunTaskRate.run_id == run_id, RunTaskRate.task_id.in_(by_task))
                          .order_by(RunTaskRate.task_id).with_for_update()).scalars()
    rates = {}
    for row in own:
        task, results = tasks[row.task_id], by_task[row.task_id]
        measured = SuccessRule.model_validate(task.pass_rate_rule) if task.pass_rate_rule else curriculum.success
        row.observe(passes=sum(measured.passed(o.reward, o.components, o.flags) for o in results),
                    samples=len(results), keep=1.0 - weight, band=band,
                    policy_version=max(o.policy_version for o in results))
        timed = [o.seconds for o in results if o.seconds is not None]
        if timed:
            mean = sum(timed) / len(timed)
            task.episode_seconds = mean if task.episode_seconds is None else (
                (1.0 - weight) * task.episode_seconds + weight * mean)
        assert row.rate is not None  # just counted
        rates[row.task_id] = row.rate
    session.flush()
    return rates


def record_sync_error(session: Session, *, run_id: int, error: str | None) -> None:
    """Why the last publish failed (None: the last one succeeded); the API and CLI show it. Flushed."""
    session.execute(update(Run).where(Run.id == run_id).values(sync_error=error))
    session.flush()
