"""Writes that must be exactly-once: episodes keyed by (run, group, sample index)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from core.models import Episode


def insert_episode(
    session: Session, *, run_id: int, group_id: int, sample_index: int, task_id: int, environment_id: int,
    **fields: Any,
) -> tuple[int, bool]:
    """Insert the episode unless its idempotency key exists. Returns (episode id, whether it was new).

    A redelivered Celery task calls this again with the same key and gets the first row back.
    """
    values = dict(
        run_id=run_id, group_id=group_id, sample_index=sample_index, task_id=task_id,
        environment_id=environment_id, **fields,
    )
    statement = (
        insert(Episode)
        .values(**values)
        .on_conflict_do_nothing(constraint="uq_episodes_idempotency_key")
        .returning(Episode.id)
    )
    new_id = session.execute(statement).scalar_one_or_none()
    if new_id is not None:
        return new_id, True
    existing = session.execute(
        select(Episode.id).where(
            Episode.run_id == run_id, Episode.group_id == group_id, Episode.sample_index == sample_index
        )
    ).scalar_one()
    return existing, False
