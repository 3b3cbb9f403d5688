"""Claiming an episode and storing its outcome: each one transaction, each safe to repeat."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session

from core.models import Episode, EpisodeArtifact, EpisodeGroup, Turn
from core.schemas.episode import FailureRecord, LayerRecord, RewardComponents
from core.termination import (
    IN_PLAY,
    JUDGE_RETRY_S,
    OUTSTANDING,
    EpisodeStatus,
    GroupStatus,
    TerminationReason,
)
from environments.base import LayerResult, Verdict
from environments.pairwise import pairwise_environments
from environments.rewards import Reward
from task_workers.episode.artifacts import screen_artifacts
from task_workers.episode.trajectory import Trajectory


def claim_episode(session: Session, *, episode_id: int, worker: str, incarnation: str | None = None
                  ) -> Episode | None:
    """Mark the episode running under this worker (and the process's incarnation, when it beats a
    heartbeat: task_workers.heartbeat); None if it has been played already (a redelivery: it has ended, or
    it awaits its judge)."""
    episode = session.execute(select(Episode).where(Episode.id == episode_id).with_for_update()).scalar_one_or_none()
    if episode is None or episode.status not in IN_PLAY:
        return None
    episode.status = EpisodeStatus.RUNNING
    episode.worker, episode.worker_incarnation = worker, incarnation
    episode.started_at = datetime.now(UTC)
    episode.attempts += 1
    return episode


def mark_group_if_complete(session: Session, group_id: int) -> None:
    """A group whose episodes have all ended is complete — unless its judge compares them pairwise: then
    it stays running until group_judge.py has stored the judge's scores and completes it."""
    outstanding = exists().where(Episode.group_id == group_id, Episode.status.in_(OUTSTANDING))
    session.execute(
        update(EpisodeGroup).where(EpisodeGroup.id == group_id, EpisodeGroup.status == GroupStatus.RUNNING,
                                   ~outstanding, EpisodeGroup.environment_id.not_in(pairwise_environments()))
        .values(status=GroupStatus.COMPLETE)
    )


@dataclass(frozen=True)
class Unscored:
    """Why a played episode has no reward yet: a learned layer's server did not answer. It is stored `scoring`
    with its turns and the layers that ran, to be judged again (task_workers/episode/rescore.py)."""

    reason: TerminationReason
    message: str
    worker: str


def store_episode(
    session: Session, *, episode_id: int, trajectory: Trajectory, verdict: Verdict | None, reward: Reward | None,
    sandbox_id: str | None, timings: dict[str, float], unscored: Unscored | None = None,
) -> bool:
    """Write the episode's outcome, every turn and its artifacts (screened: see artifacts.py). False (and
    nothing written) if a copy is stored. `reward`: environments.rewards.total of the verdict's layers and
    flags under the spec the episode ran under, as the caller derived it (0 without a verdict). `unscored`:
    the episode was played but a learned layer's server did not answer: status scoring, no reward yet, its
    termination the agent's, the layers that ran kept, due to be judged again in core.termination.JUDGE_RETRY_S."""
    episode = session.execute(select(Episode).where(Episode.id == episode_id).with_for_update()).scalar_one()
    if episode.status not in IN_PLAY:
        return False
    for turn in trajectory.turns:
        session.add(Turn(run_id=episode.run_id, episode_id=episode.id, **asdict(turn)))
    for artifact in screen_artifacts(trajectory.artifacts, num_turns=len(trajectory.turns)):
        session.add(EpisodeArtifact(run_id=episode.run_id, episode_id=episode.id, turn_index=artifact.turn_index,
                                    name=artifact.name, media_type=artifact.media_type, size=len(artifact.data),
                                    data=artifact.data))
    episode.termination_reason = trajectory.termination or TerminationReason.CANCELLED
    if unscored is not None:  # played, not scored yet: its learned layers are asked for again
        assert verdict is not None, "a judge is asked about a verdict"
        episode.status, episode.reward = EpisodeStatus.SCORING, None
        episode.reward_components = RewardComponents.validate_python(verdict.components)
        episode.failures = [*episode.failures, _failure(unscored.reason, unscored.message, unscored.worker)]
        episode.deadline_at = func.now() + timedelta(seconds=JUDGE_RETRY_S)
    else:
        episode.status = EpisodeStatus.COMPLETED
        if verdict is None:
            episode.reward, episode.reward_components = 0.0, {}
        else:
            assert reward is not None, "a verdict is stored with its reward (environments.rewards.total)"
            episode.reward = reward.value
            episode.reward_components = RewardComponents.validate_python(verdict.components)
    episode.timings = timings
    episode.verifier_layers = _layers(verdict)
    episode.final_diff = verdict.diff if verdict else None
    episode.flags = list(verdict.flags) if verdict else []
    # The oldest and newest weights any turn used (shown per episode; staleness is per token, on the turns).
    oldest, newest = trajectory.behaviour_version, trajectory.newest_version
    episode.policy_version = oldest if oldest is not None else episode.policy_version
    episode.policy_version_last = newest if newest is not None else episode.policy_version
    episode.num_turns = len(trajectory.turns)
    episode.num_tokens = trajectory.num_tokens
    episode.prefix_breaks = trajectory.prefix_breaks
    episode.unparsed_tool_calls = trajectory.unparsed_tool_calls
    episode.turns_without_tool_call = trajectory.turns_without_tool_call
    episode.program = trajectory.program
    episode.sandbox_id = sandbox_id
    episode.finished_at = datetime.now(UTC)
    session.flush()
    mark_group_if_complete(session, episode.group_id)
    return True


def _layers(verdict: Verdict | None) -> list[dict[str, Any]]:
    return [] if verdict is None else [layer_record(layer) for layer in verdict.layers]


def layer_record(layer: LayerResult) -> dict[str, Any]:
    """A verifier layer as stored in `episodes.verifier_layers` (core.schemas.episode.LayerRecord)."""
    return LayerRecord(name=layer.name, score=layer.score, passed=layer.passed, detail=layer.detail[-4000:],
                       duration_s=round(layer.duration_s, 4), record=layer.record or None).stored()


def record_fault(session: Session, *, episode_id: int, reason: TerminationReason, message: str, worker: str,
                 final: bool) -> None:
    """Log an infrastructure fault on the episode; `final` gives up (status failed), else back to pending."""
    episode = session.execute(select(Episode).where(Episode.id == episode_id).with_for_update()).scalar_one()
    if episode.status not in IN_PLAY:
        return
    episode.failures = [*episode.failures, _failure(reason, message, worker)]
    if final:
        episode.status = EpisodeStatus.FAILED
        episode.termination_reason = reason
        episode.finished_at = datetime.now(UTC)
        session.flush()
        mark_group_if_complete(session, episode.group_id)
    else:
        episode.status = EpisodeStatus.PENDING


def _failure(reason: TerminationReason, message: str, worker: str) -> dict[str, Any]:
    """One entry of `episodes.failures` (core.schemas.episode.FailureRecord)."""
    return FailureRecord(reason=reason.value, message=message[-1000:], worker=worker).stored()
