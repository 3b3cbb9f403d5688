"""Row factories for tests, the one module that makes store rows: the smallest valid row of each table,
overridable by keyword. The scenario builders (tests/api/trajectories.py, tests/trainer/rows.py,
tests/controller/factories.py, tests/support/pairwise_groups.py) compose these."""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy.orm import Session

from core.models import Environment, Episode, EpisodeGroup, Run, Task
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


def episode(session: Session, the_group: EpisodeGroup, **overrides: Any) -> Episode:
    """An episode of `the_group` (sample 0 unless given), pending unless the overrides say otherwise."""
    values: dict[str, Any] = dict(
        run_id=the_group.run_id, group_id=the_group.id, sample_index=0, task_id=the_group.task_id,
        environment_id=the_group.environment_id, policy_version=the_group.policy_version,
    )
    row = Episode(**{**values, **overrides})
    session.add(row)
    session.flush()
    return row


def pending_group(session: Session, *, env: Environment, the_task: Task, size: int = 1,
                  **run_overrides: Any) -> tuple[EpisodeGroup, list[int]]:
    """A run (scripted model unless given) with one group of `size` pending episodes of `the_task`, as the
    controller dispatches them (core.store.insert_episode); flushed, not committed."""
    the_run = run(session, **{"model": "scripted", "group_size": size, "batch_size": 1, **run_overrides})
    the_group = group(session, env=env, task=the_task, run=the_run, group_index=0)
    ids = [insert_episode(session, run_id=the_run.id, group_id=the_group.id, sample_index=sample,
                          task_id=the_task.id, environment_id=env.id)[0] for sample in range(size)]
    return the_group, ids


def pending_episode(session: Session, *, env: Environment, the_task: Task, run_name: str) -> int:
    """One single-sample run (scripted model) with one group and one pending episode, committed."""
    _, (episode_id,) = pending_group(session, env=env, the_task=the_task, name=run_name)
    session.commit()
    return episode_id
