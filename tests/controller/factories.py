"""Controller test rows and stand-ins for the other services: environments with a usable spec,
tasks, worker heartbeats, and what a task worker and the trainer write when they finish work."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from controller.runs import create_run
from core.models import Environment, Episode, EpisodeGroup, PolicyVersion, Run, Task, Worker
from core.schemas import RunConfig
from tests import factories

QUEUE = "code_repo"


def environment(session: Session, *, name: str | None = None, version: int = 1, timeout_s: float = 600.0,
                kind: str = QUEUE, **overrides: Any) -> Environment:
    """An environment version whose spec carries limits; its kind is its episodes' queue."""
    spec = {"kind": kind, "image": "code-repo", "limits": {"episode_timeout_s": timeout_s}}
    named = {"name": name} if name else {}
    return factories.environment(session, version=version, kind=kind, spec=spec, **named, **overrides)


def tasks(session: Session, env: Environment, count: int, **overrides: Any) -> list[Task]:
    return [factories.task(session, env, **overrides) for _ in range(count)]


def launch(session: Session, envs: list[Environment] | Environment, **config: Any) -> Run:
    """create_run + commit, with a small default config."""
    envs = envs if isinstance(envs, list) else [envs]
    values: dict[str, Any] = dict(
        name=f"run-{uuid.uuid4().hex[:8]}", model="tiny",
        environments=[{"name": env.name, "version": env.version} for env in envs], group_size=2, batch_size=2,
    )
    run = create_run(session, config=RunConfig.model_validate({**values, **config}))
    session.commit()
    return run


def worker(session: Session, name: str, *, queues: tuple[str, ...] = (QUEUE,), age_s: float = 0.0,
           stopped: bool = False, incarnation: str | None = None) -> Worker:
    """A worker row whose last heartbeat was `age_s` seconds ago (database clock)."""
    row = Worker(name=name, hostname="test-host", pid=1, queues=list(queues), incarnation=incarnation,
                 last_heartbeat_at=func.now() - timedelta(seconds=age_s), stopped_at=func.now() if stopped else None)
    session.add(row)
    session.commit()
    return row


def episodes(session: Session, run_id: int) -> list[Episode]:
    session.expire_all()
    return list(session.execute(select(Episode).where(Episode.run_id == run_id).order_by(Episode.id)).scalars())


def groups(session: Session, run_id: int) -> list[EpisodeGroup]:
    session.expire_all()
    query = select(EpisodeGroup).where(EpisodeGroup.run_id == run_id).order_by(EpisodeGroup.group_index)
    return list(session.execute(query).scalars())


def start(session: Session, episode_ids: list[int], *, worker: str, overdue: bool = False,
          incarnation: str | None = None) -> None:
    """What a worker's claim writes; `overdue` also moves the deadline into the past."""
    values: dict[str, Any] = dict(status="running", worker=worker, worker_incarnation=incarnation, started_at=func.now())
    if overdue:
        values["deadline_at"] = func.now() - timedelta(seconds=1)
    session.execute(update(Episode).where(Episode.id.in_(episode_ids)).values(**values))
    session.commit()


def make_overdue(session: Session, episode_ids: list[int], *, seconds: float = 1.0) -> None:
    session.execute(update(Episode).where(Episode.id.in_(episode_ids))
                    .values(deadline_at=func.now() - timedelta(seconds=seconds)))
    session.commit()


def finish_groups(session: Session, group_ids: list[int], *, reward: float = 1.0, **fields: Any) -> None:
    """What workers write when every episode of these groups ends with an agent outcome."""
    values: dict[str, Any] = dict(status="completed", termination_reason="submitted", reward=reward,
                                  finished_at=func.now(), **fields)
    session.execute(update(Episode).where(Episode.group_id.in_(group_ids)).values(**values))
    session.execute(update(EpisodeGroup).where(EpisodeGroup.id.in_(group_ids)).values(status="complete"))
    session.commit()


def train_step(session: Session, run_id: int) -> int:
    """What the trainer writes after a step: complete groups consumed, the policy version bumped."""
    run = session.get(Run, run_id, populate_existing=True)
    assert run is not None
    version = run.policy_version + 1
    session.execute(update(EpisodeGroup).where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == "complete")
                    .values(status="consumed", consumed_step=version))
    session.add(PolicyVersion(run_id=run_id, version=version, training_step=version))
    run.policy_version = version
    session.commit()
    return version
