"""Row factories for tests, the one module that makes store rows: the smallest valid row of each table,
overridable by keyword, then what each package's tests build of them:

- the controller's: environments whose spec carries limits, launched runs, worker heartbeats, and what a
  task worker and the trainer write when they finish work;
- the trainer's: a run over a tiny model, and complete groups of synthetic episodes (what task workers
  write), each episode two turns of environment + sampled tokens;
- the episode tests': one pending episode of the calc task (tests/support/calc.py).

The scenario builders (tests/api/trajectories.py, tests/support/pairwise_groups.py, tests/support/eval_runs.py,
tests/support/browser_episode.py) compose these."""

from __future__ import annotations

import itertools
import json
import random
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from controller.runs import create_run
from core.models import Environment, Episode, EpisodeGroup, PolicyVersion, Run, Task, Turn, Worker
from core.schemas import RunConfig
from core.store import insert_episode
from environments.service import register_environment
from environments.spec import parse_spec
from tests.support.calc import env_spec

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


def make_episode(session: Session, *, image: str, payload: dict, script: str, **limits: object) -> int:
    """One environment version of the calc task (tests/support/calc.py), one task naming `script`, one run,
    one group, one pending episode; committed."""
    env, _ = register_environment(session, spec=parse_spec(env_spec(image, **limits)))
    the_task = task(session, env, external_id=f"calc-{script}", instruction=f"Fix add(). [script:{script}]",
                    payload=json.loads(json.dumps(payload)))
    _, (episode_id,) = pending_group(session, env=env, the_task=the_task, name=f"run-{script}")
    session.commit()
    return episode_id


# -- the controller's tests: environments with a usable spec, tasks, worker heartbeats, and what a task
# worker and the trainer write when they finish work --------------------------------------------------

QUEUE = "code_repo"


def queued_environment(session: Session, *, name: str | None = None, version: int = 1, timeout_s: float = 600.0,
                       kind: str = QUEUE, **overrides: Any) -> Environment:
    """An environment version whose spec carries limits; its kind is its episodes' queue."""
    spec = {"kind": kind, "image": "code-repo", "limits": {"episode_timeout_s": timeout_s}}
    named = {"name": name} if name else {}
    return environment(session, version=version, kind=kind, spec=spec, **named, **overrides)


def tasks(session: Session, env: Environment, count: int, **overrides: Any) -> list[Task]:
    return [task(session, env, **overrides) for _ in range(count)]


def launch(session: Session, envs: list[Environment] | Environment, **config: Any) -> Run:
    """create_run + commit, with a small default config."""
    envs = envs if isinstance(envs, list) else [envs]
    values: dict[str, Any] = dict(
        name=f"run-{uuid.uuid4().hex[:8]}", model="tiny",
        environments=[{"name": env.name, "version": env.version} for env in envs], group_size=2, batch_size=2,
    )
    the_run = create_run(session, config=RunConfig.model_validate({**values, **config}))
    session.commit()
    return the_run


def running_on(session: Session, *, worker: str, incarnation: str) -> int:
    """An episode marked running by `worker`'s `incarnation` (of a new one-episode group); its id."""
    env = queued_environment(session)
    the_task = task(session, env, external_id=f"t-{uuid.uuid4().hex[:8]}", instruction="Fix add().")
    _, (episode_id,) = pending_group(session, env=env, the_task=the_task)
    session.execute(update(Episode).where(Episode.id == episode_id).values(
        status="running", worker=worker, worker_incarnation=incarnation))
    session.commit()
    return episode_id


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
    the_run = session.get(Run, run_id, populate_existing=True)
    assert the_run is not None
    version = the_run.policy_version + 1
    session.execute(update(EpisodeGroup).where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == "complete")
                    .values(status="consumed", consumed_step=version))
    session.add(PolicyVersion(run_id=run_id, version=version, training_step=version))
    the_run.policy_version = version
    session.commit()
    return version


# -- the trainer's tests: a run over a tiny model, complete groups of synthetic episodes -----------------


def make_run(session: Session, *, model: str, group_size: int = 4, batch_size: int = 2, max_staleness: int = 1,
             mode: str = "async", trainer: dict[str, Any] | None = None, **config: Any) -> Run:
    return run(session, name=f"train-{uuid.uuid4().hex[:8]}", model=model, mode=mode, group_size=group_size,
               batch_size=batch_size, max_staleness=max_staleness, status="running",
               config={"trainer": trainer or {}, **config})


def make_environment(session: Session, name: str | None = None) -> tuple[Environment, Task]:
    env = environment(session, **({"name": name} if name else {}))
    the_task = task(session, env)
    session.flush()
    return env, the_task


def synthetic_turns(rng: random.Random, *, vocab: int, turns: int = 2, sampled: int = 6) -> list[dict[str, Any]]:
    """Each turn: 3-8 environment tokens (mask 0) then `sampled` policy tokens (mask 1, logprob < 0)."""
    out = []
    for index in range(turns):
        env = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))]
        completion = [rng.randrange(3, vocab) for _ in range(sampled)]
        out.append({
            "index": index, "token_ids": env + completion, "loss_mask": [0] * len(env) + [1] * sampled,
            "logprobs": [0.0] * len(env) + [round(-rng.uniform(5.0, 9.0), 4) for _ in completion],
            "prompt_length": len(env), "finish_reason": "stop",
        })
    return out


def add_group(
    session: Session, *, run: Run, env: Environment, task: Task, rewards: list[float], version: int = 0,
    seed: int = 0, vocab: int = 2000, status: str = "complete", failed: tuple[int, ...] = (),
    turns: list[list[dict[str, Any]]] | None = None,
) -> EpisodeGroup:
    """A group whose episodes ended with `rewards` (indexes in `failed` ended by a sandbox fault)."""
    rng = random.Random(seed)
    index = session.query(EpisodeGroup).filter(EpisodeGroup.run_id == run.id).count()
    the_group = group(session, env=env, task=task, run=run, group_index=index, size=len(rewards),
                      policy_version=version, status=status)
    for sample, reward in enumerate(rewards):
        bad = sample in failed
        the_episode = episode(
            session, the_group, sample_index=sample,
            status="failed" if bad else "completed", termination_reason="sandbox_error" if bad else "submitted",
            reward=None if bad else reward, reward_components={} if bad else {"answer": reward}, num_turns=2,
        )
        if bad:
            continue
        for turn in (turns[sample] if turns else synthetic_turns(rng, vocab=vocab)):
            session.add(Turn(run_id=run.id, episode_id=the_episode.id, completion_text="", **turn))
    session.flush()
    return the_group
