"""Pairwise-judged groups for tests: a group of pending episodes, each ended as the worker stores it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from core.models import Environment, Episode, EpisodeGroup
from core.termination import TerminationReason
from environments.base import LayerResult, Verdict
from environments.judge import flag_injection, transcript_of
from environments.rewards import total
from environments.service import register_environment, spec_of
from environments.spec import parse_spec
from task_workers.episode.persist import Unscored, claim_episode, store_episode
from task_workers.episode.trajectory import Trajectory, TurnRecord
from tests import factories
from trainer.store import claim_complete_groups

WEIGHT = 0.5


def make_group(session: Session, *, judge_url: str, size: int, model: str = "stand-in", mode: str = "pairwise",
               **verifier: Any) -> tuple[int, list[int]]:
    """A judged environment (pairwise unless `mode` says; hidden_tests weighted 1, judge WEIGHT), a task, a
    run, one group of `size` pending episodes."""
    judge = {"url": judge_url, "model": model, "rubric": "The better fix wins.", "mode": mode, "retries": 0,
             "max_tokens": 200, "max_transcript_chars": 2000}
    spec = {"name": "pairwise", "kind": "code_repo", "image": "base",
            "verifier": {"weights": {"hidden_tests": 1.0, "judge": WEIGHT}, "judge": judge, **verifier}}
    env, _ = register_environment(session, spec=parse_spec(spec))
    tag = uuid.uuid4().hex[:8]
    task = factories.task(session, env, external_id=f"t-{tag}", instruction="Fix add().")
    group, ids = factories.pending_group(session, env=env, the_task=task, size=size, name=f"pairwise-{tag}")
    session.commit()
    return group.id, ids


def end_episode(session: Session, episode_id: int, *, text: str, reward: float, flags: Sequence[str] = (),
                unscored: Unscored | None = None) -> None:
    """Store the episode's outcome as the worker does (runner.run_episode: the judge's screen for injected
    lines, then persist.store_episode): one turn saying `text`. `unscored`: its pointwise judge did not
    answer (stored `scoring`)."""
    episode = claim_episode(session, episode_id=episode_id, worker="test")
    assert episode is not None
    turn = TurnRecord(index=0, token_ids=[1, 2], logprobs=[0.0, -0.5], loss_mask=[0, 1], prompt_length=1,
                      completion_text=text, finish_reason="stop", generation_s=0.01, weight_version=0,
                      weight_version_end=0, observation="ok")
    trajectory = Trajectory(turns=[turn], termination=TerminationReason.SUBMITTED, submitted=True)
    verdict = Verdict(layers=[LayerResult("hidden_tests", reward, reward == 1.0)], flags=list(flags))
    verdict = flag_injection(verdict, transcript=transcript_of(trajectory.turns))
    spec = spec_of(session.get(Environment, episode.environment_id))  # type: ignore[arg-type]
    assert store_episode(session, episode_id=episode_id, trajectory=trajectory, verdict=verdict,
                         reward=total(verdict.layers, verdict.flags, spec), sandbox_id=None,
                         timings={"total": 1.0}, unscored=unscored)
    session.commit()


def claimable(session: Session, group_id: int) -> bool:
    run_id = session.get(EpisodeGroup, group_id).run_id  # type: ignore[union-attr]
    claimed = [group.id for group in claim_complete_groups(session, run_id=run_id, limit=10)]
    session.rollback()  # release the trainer's row locks
    return group_id in claimed


def group_status(session: Session, group_id: int) -> str:
    session.expire_all()
    return session.get(EpisodeGroup, group_id).status  # type: ignore[union-attr]


def episodes_of(session: Session, ids: list[int]) -> list[Episode]:
    session.expire_all()
    return [session.get(Episode, episode_id) for episode_id in ids]  # type: ignore[misc]
