"""Mixing hack canaries into a run (core/canaries.py): which groups are canaries, and their tasks.

    if is_canary_group(run_id=run.id, seed=config.seed, group_index=index, rate=config.canary_rate,
                       after=config.canary_after):
        task_id = canary_task_id(session, task_id=pick.task_id) or pick.task_id
"""

from __future__ import annotations

import hashlib

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from core.canaries import PREFIX, canary_split
from core.models import Environment, Task
from environments.code_repo.canary import canary_variant
from environments.code_repo.kind import CodeRepoKind


def is_canary_group(*, run_id: int, seed: int, group_index: int, rate: float, after: int = 0) -> bool:
    """Deterministic per (run, seed, group): a resumed controller makes the same choice. None of the first
    `after` groups is one."""
    if rate <= 0 or group_index < after:
        return False
    digest = hashlib.sha256(f"canary:{run_id}:{seed}:{group_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def canary_task_id(session: Session, *, task_id: int) -> int | None:
    """The canary of a code_repo task (the task marked `canary`: environments/code_repo/canary.py), stored once
    as a task of split `canary:<split>`; None when the task is of another kind or has no reference solution."""
    task = session.get(Task, task_id)
    if task is None:
        return None
    kind = session.execute(select(Environment.kind).where(Environment.name == task.environment_name)
                           .order_by(Environment.version.desc()).limit(1)).scalar_one_or_none()
    if kind != CodeRepoKind.name:
        return None
    external_id = (PREFIX + task.external_id)[:256]
    existing = session.execute(select(Task.id).where(Task.environment_name == task.environment_name,
                                                     Task.external_id == external_id)).scalar_one_or_none()
    if existing is not None:
        return existing
    variant = canary_variant(task.payload)
    if variant is None:
        return None
    session.execute(insert(Task).values(environment_name=task.environment_name, external_id=external_id,
                                        split=canary_split(task.split), instruction=task.instruction, payload=variant)
                    .on_conflict_do_nothing(index_elements=["environment_name", "external_id"]))
    return session.execute(select(Task.id).where(Task.environment_name == task.environment_name,
                                                 Task.external_id == external_id)).scalar_one()
