"""Row factories for tests: the smallest valid rows, overridable by keyword."""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy.orm import Session

from core.models import Environment, EpisodeGroup, Run, Task
from core.store import insert_episode

_ids = itertools.count(1)


def environment(session: Session, **overrides: Any) -> Environment:
    n = next(_ids)
    values: dict[str, Any] = dict(
        name=f"env-{n}", version=1, kind="code_repo", spec={"image": "crucible/code-repo"}, spec_hash=f"{n:064x}"
    )
    row = Environment(**{**values, **overrides})
    session.add(row)
    session.flush()
    return row


def task(session: Session, env: Environment, **overrides: Any) -> Task:
    values: dict[str, Any] = dict(
        environment_name=env.name, external_id=f"task-{next(_ids)}", instruction="fix the bug", payload={}
    )
    row = Task(**{**values, **overrides})
    session.add(row)
    session.flush()
    return row


def run(session: Session, **overrides: Any) -> Run:
    values: dict[str, Any] = dict(name=f"run-{next(_ids)}", model="tiny", group_size=4, batch_size=2, config={})
    row = Run(**{**values, **overrides})
    session.add(row)
    session.flush()
    return row


def group(session: Session, **overrides: Any) -> EpisodeGroup:
    env = overrides.pop("env", None) or environment(session)
    the_task = overrides.pop("task", None) or task(session, env)
    the_run = overrides.pop("run", None) or run(session)
    values: dict[str, Any] = dict(
        run_id=the_run.id, group_index=next(_ids), task_id=the_task.id, environment_id=env.id,
        size=the_run.group_size, policy_version=0,
    )
    row = EpisodeGroup(**{**values, **overrides})
    session.add(row)
    session.flush()
    return row


def pending_episode(session: Session, *, env: Environment, the_task: Task, run_name: str) -> int:
    """One single-sample run (scripted model) with one group and one pending episode, committed."""
    the_run = run(session, name=run_name, model="scripted", group_size=1, batch_size=1)
    the_group = group(session, env=env, task=the_task, run=the_run, group_index=0)
    episode_id, _ = insert_episode(session, run_id=the_run.id, group_id=the_group.id, sample_index=0,
                                   task_id=the_task.id, environment_id=env.id)
    session.commit()
    return episode_id
