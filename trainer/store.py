"""The trainer's reads and writes of the store; each says which transaction it belongs to.

Exactly-once consumption: a step claims complete groups with `SELECT … FOR UPDATE SKIP LOCKED` in
its step transaction and keeps the row locks while it trains. Only after the optimizer step (and
the checkpoint, written as pending) does the same transaction mark them consumed and insert the
training_steps row, then commit. A trainer killed before the commit loses its connection, Postgres
rolls the transaction back and releases the locks: the groups are `complete` again and the next
trainer claims them. A second trainer never sees locked rows (SKIP LOCKED).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from core.models import EpisodeGroup, PolicyVersion, Run, TrainingStep

COMPLETE, CONSUMED, DROPPED, RUNNING = "complete", "consumed", "dropped", "running"


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


def more_groups_possible(session: Session, *, run_id: int) -> bool:
    """Whether the controller may still dispatch groups for the run: it is active and its budget
    (`max_groups` in its config, counting every group dispatched) is not spent."""
    run = get_run(session, run_id=run_id)
    if run.status not in ("pending", "running"):
        return False
    budget = (run.config or {}).get("max_groups")
    if budget is None:
        return True
    dispatched = session.execute(select(func.count()).where(EpisodeGroup.run_id == run_id)).scalar_one()
    return int(dispatched) < int(budget)


def mark_dropped(session: Session, *, group_ids: list[int]) -> None:
    """Groups that will never be trained on (zero variance, stale, no trainable sample); flushed."""
    if group_ids:
        session.execute(
            update(EpisodeGroup).where(EpisodeGroup.id.in_(group_ids), EpisodeGroup.status == COMPLETE)
            .values(status=DROPPED)
        )


def record_step(
    session: Session, *, run_id: int, step: int, policy_version: int, consumed: list[int], dropped: list[int],
    metrics: dict[str, Any],
) -> None:
    """In the step transaction, after the optimizer step: consume the batch's groups, drop the
    rejected ones and insert the step's metrics. Flushed; the caller commits.

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
    mark_dropped(session, group_ids=dropped)
    session.add(TrainingStep(run_id=run_id, step=step, policy_version=policy_version, metrics=metrics))
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
