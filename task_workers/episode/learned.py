"""The learned layers of a verdict — a pointwise judge's, a reward model's — asked after the episode was
played, from its text alone; and asked again from the store for an episode whose servers did not answer.

    verdict = with_learned(spec, instruction=..., turns=trajectory.turns, verdict=verdict)  # the worker
    rescore_stored(episode_id, worker="w1")   # a redelivered `scoring` episode (the reconciler resends it)

A server that does not answer (after its client's retries, with back-off) is JudgeFault, never a zero
reward. The worker then stores the episode `scoring` (persist.store_episode): its turns, its termination
and the layers that ran are kept, nothing of it is played again. Each redelivery judges it from its
stored turns — the very text the judge would have read at the end of play (environments.judge
.transcript_of, core.episode_text.render_turns) — and, in one transaction that finds it still
`scoring`, adds the layers, the reward (environments.rewards.total) and completes it, so two workers
judging it at once store it once. Another failure is recorded in its failures and it is due again in
core.termination.JUDGE_RETRY_S; the reconciler ends it `failed/judge_error` past the run's judge_patience_s.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from core.db import session_scope
from core.episode_text import render_turns
from core.models import Environment, Episode, Task, Turn
from core.schemas.episode import FailureRecord, LayerRecord, RewardComponents
from core.termination import JUDGE_RETRY_S, EpisodeStatus, TerminationReason
from environments.base import LayerResult, Verdict
from environments.judge import LAYER as JUDGE_LAYER
from environments.judge import Judge, LearnedRewardUnavailable, transcript_of
from environments.reward_model_layer import LAYER as RM_LAYER
from environments.reward_model_layer import score_episode
from environments.rewards import FlagPolicy, total
from environments.service import spec_of
from environments.spec import EnvironmentSpec, JudgeConfig
from task_workers.episode.errors import JudgeFault
from task_workers.episode.persist import layer_record, mark_group_if_complete

logger = logging.getLogger(__name__)

RESCORE_SOURCE = "rescore"
"""`source` of a failed ask from the store in `episodes.failures`."""
MAX_RETRY_RECORDS = 50


def has_learned_layers(spec: EnvironmentSpec) -> bool:
    return pointwise_judge(spec) is not None or spec.verifier.reward_model is not None


def pointwise_judge(spec: EnvironmentSpec) -> JudgeConfig | None:
    """The spec's judge when it scores each episode alone (a pairwise one scores the group once it has ended)."""
    judge = spec.verifier.judge
    return judge if judge is not None and judge.mode == "pointwise" else None


def with_learned(spec: EnvironmentSpec, *, instruction: str, turns: Sequence[Any], verdict: Verdict) -> Verdict:
    """The verdict with the learned layers the spec names added (each counts with its weight in
    environments.rewards.total). `turns`: the episode's, played or stored (index, completion_text,
    observation). An episode a hack monitor zeroed is sent to neither (nothing they say could count)."""
    verifier = spec.verifier
    judge_config = pointwise_judge(spec)
    names = [name for name, config in ((JUDGE_LAYER, judge_config), (RM_LAYER, verifier.reward_model)) if config]
    if FlagPolicy.of(verifier).zeroes(verdict.flags):
        skipped = [LayerResult(name=name, score=0.0, passed=False, detail="not run: a hack monitor flagged the episode")
                   for name in names]
        return dataclasses.replace(verdict, layers=[*verdict.layers, *skipped])
    layers = []
    try:
        if judge_config is not None:
            judge = Judge(judge_config)
            try:
                layers.append(judge.pointwise(instruction=instruction, transcript=transcript_of(list(turns))))
            finally:
                judge.close()
        if verifier.reward_model is not None:
            response = render_turns([(turn.completion_text, turn.observation) for turn in turns])
            layers.append(score_episode(verifier.reward_model, prompt=instruction, response=response))
    except LearnedRewardUnavailable as error:
        raise JudgeFault(str(error)) from error
    return dataclasses.replace(verdict, layers=[*verdict.layers, *layers])


def rescore_stored(episode_id: int, *, worker: str) -> bool:
    """Judge a `scoring` episode again from the store; True if this call completed it. False when it is not
    `scoring` (scored meanwhile, or failed past its bound) or when its server failed again (recorded)."""
    with session_scope() as session:
        episode = session.get(Episode, episode_id)
        if episode is None or episode.status != EpisodeStatus.SCORING:
            return False
        env_row, task = session.get(Environment, episode.environment_id), session.get(Task, episode.task_id)
        assert env_row is not None and task is not None  # foreign keys
        spec, instruction, run_id = spec_of(env_row), task.instruction, episode.run_id
        # Not due again while this ask may still be answered: the reconciler resends no second copy meanwhile.
        episode.deadline_at = func.now() + timedelta(seconds=JUDGE_RETRY_S + _asking_budget_s(spec))
        stored = Verdict(layers=[LayerResult(**record.model_dump()) for record in LayerRecord.read_all(
            episode.verifier_layers)], flags=list(episode.flags or []), diff=episode.final_diff or "")
        turns = list(session.execute(select(Turn).where(Turn.run_id == run_id, Turn.episode_id == episode_id)
                                     .order_by(Turn.index)).scalars())
        session.flush()
        session.expunge_all()  # the judge is asked with no transaction open (session_scope commits on exit)
    started = time.monotonic()
    try:
        verdict = with_learned(spec, instruction=instruction, turns=turns, verdict=stored)
    except JudgeFault as fault:
        _record_retry(episode_id, error=str(fault), worker=worker)
        return False
    added = verdict.layers[len(stored.layers):]
    with session_scope() as session:
        episode = session.execute(select(Episode).where(Episode.id == episode_id).with_for_update()).scalar_one()
        if episode.status != EpisodeStatus.SCORING:  # another worker stored it first, or its bound passed
            return False
        episode.verifier_layers = [*episode.verifier_layers, *(layer_record(layer) for layer in added)]
        episode.reward_components = RewardComponents.validate_python(verdict.components)
        episode.reward = total(verdict.layers, verdict.flags, spec).value
        episode.timings = {**(episode.timings or {}), "judge": round(time.monotonic() - started, 4)}
        episode.status = EpisodeStatus.COMPLETED
        session.flush()
        mark_group_if_complete(session, episode.group_id)
    logger.info("episode %s judged after its judge came back: reward=%s", episode_id, episode.reward)
    return True


def _asking_budget_s(spec: EnvironmentSpec) -> float:
    """The longest one ask of the spec's learned layers can take: each server's timeout, retried."""
    configs = [config for config in (pointwise_judge(spec), spec.verifier.reward_model) if config is not None]
    return sum(config.timeout_s * (config.retries + 1) for config in configs)


def _record_retry(episode_id: int, *, error: str, worker: str) -> None:
    """The failed ask in the episode's failures (the first MAX_RETRY_RECORDS, then the latest in place of the
    last: a long patience must not grow the row without bound), and the next ask due in JUDGE_RETRY_S."""
    with session_scope() as session:
        episode = session.execute(select(Episode).where(Episode.id == episode_id).with_for_update()).scalar_one()
        if episode.status != EpisodeStatus.SCORING:
            return
        asked = 1 + sum(1 for failure in FailureRecord.read_all(episode.failures)
                        if failure.reason == TerminationReason.JUDGE_ERROR and failure.source == RESCORE_SOURCE)
        record = FailureRecord(reason=TerminationReason.JUDGE_ERROR.value, message=error[-1000:], worker=worker,
                               source=RESCORE_SOURCE, attempt=asked).stored()
        kept = episode.failures if asked <= MAX_RETRY_RECORDS else episode.failures[:-1]
        episode.failures = [*kept, record]
        episode.deadline_at = func.now() + timedelta(seconds=JUDGE_RETRY_S)
    logger.warning("episode %s: its judge failed again (due again in %g s): %s", episode_id, JUDGE_RETRY_S, error)
