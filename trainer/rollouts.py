"""Rollouts as the trainer sees them: a group's samples, each one token sequence with its loss mask,
behaviour logprobs, reward and the policy version that produced it; read from the store.

An episode's turns concatenated in index order are the exact sequence the policy saw (each turn:
environment tokens, mask 0, then the sampled tokens, mask 1, with vLLM's logprobs).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.canaries import is_canary
from core.models import Environment, Episode, EpisodeGroup, Task, Turn
from core.termination import EpisodeStatus, TerminationReason


@dataclass
class Sample:
    """One episode, flattened."""

    episode_id: int
    group_id: int
    environment: str
    status: str
    termination: str | None
    reward: float
    components: dict[str, float]
    policy_version: int
    token_ids: list[int]  # (T,) every turn's tokens in order
    loss_mask: list[int]  # (T,) 1 where the policy sampled the token
    behaviour_logprobs: list[float]  # (T,) vLLM's logprob of each sampled token, 0 elsewhere
    turns: int = 0
    truncated: bool = False
    """The last completion was cut by its token budget (finish reason `length`)."""
    score: float = 0.0
    """The reward after shaping and normalisation: what the advantage is computed from."""
    advantage: float = 0.0
    mixed: dict[str, float] = field(default_factory=dict)
    """Under `verifier.mix: zscore`, each layer's α·z in the score (trainer.advantages.mix_layers)."""
    task_id: int = 0
    flags: tuple[str, ...] = ()
    """What the hack monitors saw (core.flags.EpisodeFlag values)."""

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def trainable(self) -> bool:
        """The agent's own outcome (not an infrastructure fault, not cancelled)."""
        if self.status != EpisodeStatus.COMPLETED or self.termination is None:
            return False
        return TerminationReason(self.termination).is_trainable and self.sampled_tokens > 0


@dataclass
class Group:
    """G samples of one task: the unit whose rewards are compared."""

    id: int
    group_index: int
    environment: str
    policy_version: int
    samples: list[Sample] = field(default_factory=list)
    mix: dict[str, float] | None = None
    """α per layer when the environment's spec says `verifier.mix: zscore` (trainer.advantages.mix_layers);
    None: the episode's reward is the score."""
    canary: bool = False
    """A hack canary's group (core/canaries.py): measured, never trained on."""


def _environments(session: Session, ids: set[int]) -> dict[int, tuple[str, dict[str, float] | None]]:
    """Each environment's name, and its layers' α when its spec mixes them by z-score."""
    rows = session.execute(select(Environment.id, Environment.name, Environment.spec)
                           .where(Environment.id.in_(ids))).all()
    out: dict[int, tuple[str, dict[str, float] | None]] = {}
    for env_id, name, spec in rows:
        verifier = (spec or {}).get("verifier") or {}
        mixed = verifier.get("mix") == "zscore"
        out[env_id] = (name, {k: float(v) for k, v in verifier.get("weights", {}).items() if v} if mixed else None)
    return out


def _turns_by_episode(session: Session, run_ids: set[int], episode_ids: list[int]) -> dict[int, list[Any]]:
    query = (  # naming the runs reads their partitions only
        select(Turn.episode_id, Turn.token_ids, Turn.loss_mask, Turn.logprobs, Turn.finish_reason)
        .where(Turn.run_id.in_(run_ids), Turn.episode_id.in_(episode_ids))
        .order_by(Turn.episode_id, Turn.index)
    )
    turns: dict[int, list[Any]] = defaultdict(list)
    for row in session.execute(query):
        turns[row.episode_id].append(row)
    return turns


def _sample(episode: Episode, turns: list[Any], *, environment: str, group_version: int) -> Sample:
    token_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for turn in turns:
        token_ids += turn.token_ids
        mask += turn.loss_mask
        logprobs += turn.logprobs
    version = episode.policy_version if episode.policy_version is not None else group_version
    return Sample(
        episode_id=episode.id, group_id=episode.group_id, environment=environment, status=episode.status,
        termination=episode.termination_reason, reward=float(episode.reward or 0.0),
        components={k: float(v) for k, v in (episode.reward_components or {}).items()},
        policy_version=version, token_ids=token_ids, loss_mask=mask, behaviour_logprobs=logprobs,
        turns=len(turns), truncated=bool(turns) and turns[-1].finish_reason == "length", task_id=episode.task_id,
        flags=tuple(episode.flags or ()),
    )


def load_groups(session: Session, groups: list[EpisodeGroup]) -> list[Group]:
    """Every episode of `groups` with its turns, in group order then sample order."""
    if not groups:
        return []
    environments = _environments(session, {group.environment_id for group in groups})
    splits = dict(session.execute(select(Task.id, Task.split).where(Task.id.in_({g.task_id for g in groups}))).all())
    by_id = {
        group.id: Group(id=group.id, group_index=group.group_index, environment=environments[group.environment_id][0],
                        policy_version=group.policy_version, mix=environments[group.environment_id][1],
                        canary=is_canary(splits.get(group.task_id)))
        for group in groups
    }
    episodes = list(session.execute(
        select(Episode).where(Episode.group_id.in_(by_id)).order_by(Episode.group_id, Episode.sample_index)
    ).scalars())
    turns = _turns_by_episode(session, {group.run_id for group in groups}, [episode.id for episode in episodes])
    for episode in episodes:
        group = by_id[episode.group_id]
        group.samples.append(_sample(episode, turns.get(episode.id, []), environment=group.environment,
                                     group_version=group.policy_version))
    return [by_id[group.id] for group in groups]
