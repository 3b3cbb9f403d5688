"""Rollouts as the trainer sees them: a group's samples, each one token sequence with its loss mask,
behaviour logprobs, reward and the policy version that produced it; read from the store.

An episode's turns concatenated in index order are the exact sequence the policy saw (each turn:
environment tokens, mask 0, then the sampled tokens, mask 1, with vLLM's logprobs and the weight
version that sampled each; a turn stored without per-token versions labels its tokens with its oldest).
A sample whose arrays do not line up is refused at load (MalformedSample), never trained on misaligned:
`load_groups` leaves it out of its group (`Group.malformed`, logged; the step counts it in `left_out` as
`malformed`), and the group trains on the rest.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.canaries import is_canary
from core.errors import CrucibleError
from core.models import Environment, Episode, EpisodeGroup, Task, Turn
from core.termination import EpisodeStatus, TerminationReason
from core.token_versions import decode
from environments.rewards import FlagPolicy, verifier_of, zscore_alphas

log = logging.getLogger(__name__)
ENVIRONMENT = -1
"""The version label of an environment token in `Sample.token_versions` (nothing sampled it)."""


class MalformedSample(CrucibleError):
    """An episode's stored arrays do not line up: training on it would pair tokens with the wrong
    logprobs or versions."""


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
    token_versions: list[int] = field(default_factory=list)
    """(T,) the weight version that sampled each token, ENVIRONMENT (−1) for environment tokens."""
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
    seconds: float | None = None
    """The episode's wall-clock seconds (timings.total), for the task's duration estimate."""
    loss_weights: list[int] | None = None
    """(T,) the loss mask after the staleness mask (trainer.selection): a sampled token too far behind
    stays in the context with no loss weight. None: the loss mask itself."""
    lags: list[int] = field(default_factory=list)
    """Each sampled token's version lag behind the trained version (set with `loss_weights`)."""
    prefix_breaks: int = 0
    """Turns whose prompt was not the previous turn's prompt and completion extended (episodes.prefix_breaks)."""
    unparsed_tool_calls: int = 0
    turns_without_tool_call: int = 0
    segments: list[int] = field(default_factory=list)
    """Where each token stream after the first begins (an agent program's call that rewrote its context:
    turns.segment): each is a sequence of its own in the update (`rows`), with the episode's advantage."""
    row: int | None = None
    """This sequence's number in an update (trainer.step.update numbers the rows); None: not in one."""

    def __post_init__(self) -> None:
        lengths = {"token_ids": len(self.token_ids), "loss_mask": len(self.loss_mask),
                   "behaviour_logprobs": len(self.behaviour_logprobs)}
        if self.token_versions:
            lengths["token_versions"] = len(self.token_versions)
        if len(set(lengths.values())) > 1:
            raise MalformedSample(f"episode {self.episode_id}: expected its per-token arrays to have one length, "
                                  f"got {lengths}")

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def trained_mask(self) -> list[int]:
        """1 where the token carries loss weight."""
        return self.loss_mask if self.loss_weights is None else self.loss_weights

    def sampled_versions(self) -> list[int]:
        """The version of each sampled token, in order (all the episode's version when not labelled)."""
        if not self.token_versions:
            return [self.policy_version] * self.sampled_tokens
        return [v for v, m in zip(self.token_versions, self.loss_mask, strict=True) if m]

    @property
    def key(self) -> int:
        """The key of its per-row tensors (micro-batches' sample_ids): its row in an update, else its episode."""
        return self.episode_id if self.row is None else self.row

    def rows(self) -> list[Sample]:
        """The sample as the sequences the policy sampled from: itself, or one per token segment (each
        starts a new context; the episode's advantage and score on every one)."""
        if not self.segments:
            return [self]
        bounds = [0, *self.segments, len(self.token_ids)]
        parts, lag_at = [], 0
        for start, end in itertools.pairwise(bounds):
            sampled = sum(self.loss_mask[start:end])
            parts.append(replace(
                self, token_ids=self.token_ids[start:end], loss_mask=self.loss_mask[start:end],
                behaviour_logprobs=self.behaviour_logprobs[start:end],
                token_versions=self.token_versions[start:end] if self.token_versions else [],
                loss_weights=self.loss_weights[start:end] if self.loss_weights is not None else None,
                lags=self.lags[lag_at:lag_at + sampled] if self.lags else [], segments=[]))
            lag_at += sampled
        return parts

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
    flag_policy: FlagPolicy = field(default_factory=FlagPolicy)
    """What a flag costs in the environment (`verifier.flag_policy`, `flag_penalty`): `mix: zscore`
    rebuilds the score from the layers and must charge a flag again (trainer.advantages.mix_layers)."""
    malformed: list[int] = field(default_factory=list)
    """Episodes of the group refused at load (MalformedSample): not in `samples`, never trained on."""


@dataclass(frozen=True)
class _EnvironmentView:
    name: str
    mix: dict[str, float] | None
    flag_policy: FlagPolicy


def _environments(session: Session, ids: set[int]) -> dict[int, _EnvironmentView]:
    """Each environment's name, its layers' α when its spec mixes them by z-score, and what a flag costs."""
    rows = session.execute(select(Environment.id, Environment.name, Environment.spec)
                           .where(Environment.id.in_(ids))).all()
    out: dict[int, _EnvironmentView] = {}
    for env_id, name, spec in rows:
        verifier = verifier_of(spec)
        out[env_id] = _EnvironmentView(name=name, mix=zscore_alphas(verifier), flag_policy=FlagPolicy.of(verifier))
    return out


def _turns_by_episode(session: Session, run_ids: set[int], episode_ids: list[int]) -> dict[int, list[Any]]:
    query = (  # naming the runs reads their partitions only
        select(Turn.episode_id, Turn.token_ids, Turn.loss_mask, Turn.logprobs, Turn.finish_reason, Turn.prompt_length,
               Turn.weight_version, Turn.version_runs, Turn.segment)
        .where(Turn.run_id.in_(run_ids), Turn.episode_id.in_(episode_ids))
        .order_by(Turn.episode_id, Turn.index)
    )
    turns: dict[int, list[Any]] = defaultdict(list)
    for row in session.execute(query):
        turns[row.episode_id].append(row)
    return turns


def _turn_versions(episode_id: int, turn: Any, *, fallback: int) -> list[int]:
    """(P + C,) ENVIRONMENT for the environment tokens, then each sampled token's version."""
    completion = len(turn.token_ids) - turn.prompt_length
    if turn.version_runs:
        try:
            sampled = decode(turn.version_runs, length=completion)
        except ValueError as error:
            raise MalformedSample(f"episode {episode_id}: {error}") from None
    else:  # stored before per-token versions: the oldest version that can have sampled the turn
        sampled = [turn.weight_version if turn.weight_version is not None else fallback] * completion
    return [ENVIRONMENT] * turn.prompt_length + sampled


def _sample(episode: Episode, turns: list[Any], *, environment: str, group_version: int) -> Sample:
    token_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    segments: list[int] = []
    version = episode.policy_version if episode.policy_version is not None else group_version
    for previous, turn in zip([None, *turns], turns, strict=False):
        if previous is not None and turn.segment != previous.segment:
            segments.append(len(token_ids))
        if not len(turn.token_ids) == len(turn.loss_mask) == len(turn.logprobs):
            raise MalformedSample(f"episode {episode.id} turn: expected aligned arrays, got {len(turn.token_ids)} "
                                  f"tokens, {len(turn.loss_mask)} mask entries, {len(turn.logprobs)} logprobs")
        token_ids += turn.token_ids
        mask += turn.loss_mask
        logprobs += turn.logprobs
        versions += _turn_versions(episode.id, turn, fallback=version)
    return Sample(
        episode_id=episode.id, group_id=episode.group_id, environment=environment, status=episode.status,
        termination=episode.termination_reason, reward=float(episode.reward or 0.0),
        components={k: float(v) for k, v in (episode.reward_components or {}).items()},
        policy_version=version, token_ids=token_ids, loss_mask=mask, behaviour_logprobs=logprobs,
        token_versions=versions, turns=len(turns), truncated=bool(turns) and turns[-1].finish_reason == "length",
        task_id=episode.task_id, flags=tuple(episode.flags or ()), seconds=_seconds(episode.timings),
        prefix_breaks=episode.prefix_breaks or 0, unparsed_tool_calls=episode.unparsed_tool_calls or 0,
        turns_without_tool_call=episode.turns_without_tool_call or 0, segments=segments,
    )


def _seconds(timings: Any) -> float | None:
    total = timings.get("total") if isinstance(timings, dict) else None
    return float(total) if isinstance(total, int | float) and not isinstance(total, bool) and total >= 0 else None


def load_groups(session: Session, groups: list[EpisodeGroup]) -> list[Group]:
    """Every episode of `groups` with its turns, in group order then sample order."""
    if not groups:
        return []
    environments = _environments(session, {group.environment_id for group in groups})
    splits = dict(session.execute(select(Task.id, Task.split).where(Task.id.in_({g.task_id for g in groups}))).all())
    by_id = {
        group.id: Group(id=group.id, group_index=group.group_index, environment=environments[group.environment_id].name,
                        policy_version=group.policy_version, mix=environments[group.environment_id].mix,
                        canary=is_canary(splits.get(group.task_id)),
                        flag_policy=environments[group.environment_id].flag_policy)
        for group in groups
    }
    episodes = list(session.execute(
        select(Episode).where(Episode.group_id.in_(by_id)).order_by(Episode.group_id, Episode.sample_index)
    ).scalars())
    turns = _turns_by_episode(session, {group.run_id for group in groups}, [episode.id for episode in episodes])
    for episode in episodes:
        group = by_id[episode.group_id]
        try:
            group.samples.append(_sample(episode, turns.get(episode.id, []), environment=group.environment,
                                         group_version=group.policy_version))
        except MalformedSample as error:  # one bad episode must not stop the run: its group trains on the rest
            log.warning("group %d: %s; the episode is left out (malformed)", group.id, error)
            group.malformed.append(episode.id)
    return [by_id[group.id] for group in groups]
