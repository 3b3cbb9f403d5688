"""Store rows for trainer tests: a run over a tiny model, and complete groups of synthetic episodes
(what task workers write), each episode two turns of environment + sampled tokens."""

from __future__ import annotations

import random
import uuid
from typing import Any

from sqlalchemy.orm import Session

from core.models import Environment, EpisodeGroup, Run, Task, Turn
from tests import factories


def make_run(session: Session, *, model: str, group_size: int = 4, batch_size: int = 2, max_staleness: int = 1,
             mode: str = "async", trainer: dict[str, Any] | None = None, **config: Any) -> Run:
    return factories.run(session, name=f"train-{uuid.uuid4().hex[:8]}", model=model, mode=mode, group_size=group_size,
                         batch_size=batch_size, max_staleness=max_staleness, status="running",
                         config={"trainer": trainer or {}, **config})


def make_environment(session: Session, name: str | None = None) -> tuple[Environment, Task]:
    env = factories.environment(session, **({"name": name} if name else {}))
    task = factories.task(session, env)
    session.flush()
    return env, task


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
    group = factories.group(session, env=env, task=task, run=run, group_index=index, size=len(rewards),
                            policy_version=version, status=status)
    for sample, reward in enumerate(rewards):
        bad = sample in failed
        episode = factories.episode(
            session, group, sample_index=sample,
            status="failed" if bad else "completed", termination_reason="sandbox_error" if bad else "submitted",
            reward=None if bad else reward, reward_components={} if bad else {"answer": reward}, num_turns=2,
        )
        if bad:
            continue
        for turn in (turns[sample] if turns else synthetic_turns(rng, vocab=vocab)):
            session.add(Turn(run_id=run.id, episode_id=episode.id, completion_text="", **turn))
    session.flush()
    return group
