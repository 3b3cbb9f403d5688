"""Pairwise judging of a group whose episodes have all ended (`verifier.judge.mode: pairwise`).

    judge_finished_group(group_id)   # the worker that stored the group's last episode; any redelivery of
                                     # one of its episodes (the task's retry after a judge outage, the
                                     # reconciler's resend of a group nobody judged) calls it again
    judge_after_failure(episode_id)  # the task whose episode failed for good (maybe the group's last)

Such a group stays `running` when its last episode ends (persist.py and the reconciler complete every
other group, never this one). Here its episodes are compared (environments/pairwise.py) and then, in ONE
transaction, each one's `judge` layer, reward component, reward and judge time are added and the group
is marked complete: the trainer can never claim it half-judged. A judge that does not answer is a
JudgeFault (an infrastructure fault: retried) and nothing is written. One worker judges a group at a
time, under a Postgres advisory lock that a dead worker's connection releases. Each failed judging is
recorded in the failures of the group's episodes (`source: group_judge`); after MAX_JUDGING_ATTEMPTS of
them the group is dropped (status `dropped`, the reason recorded there and logged), so a judge that never
answers cannot hold the run open forever. The lock is waited for,
never tried: two workers storing a group's last two episodes at once each see the other's still running
while they hold it — the second one in finds the group whole (or judged) once the first lets go.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from core.db import get_engine, session_scope
from core.models import Environment, Episode, EpisodeGroup, Task, Turn
from core.schemas.episode import FailureRecord, LayerRecord
from core.settings import public_url
from core.termination import OUTSTANDING, EpisodeStatus, GroupStatus, TerminationReason
from environments.base import LayerResult
from environments.judge import LAYER, Judge, LearnedRewardUnavailable, transcript_of
from environments.pairwise import Contender, judge_group
from environments.rewards import FlagPolicy, total
from environments.service import spec_of
from environments.spec import EnvironmentSpec
from task_workers.episode.errors import JudgeFault
from task_workers.episode.persist import layer_record

logger = logging.getLogger(__name__)

LOCK_NAMESPACE = 0x4A554447  # "JUDG": the first key of a group's judging lock, the group id the second
JUDGING_SOURCE = "group_judge"
"""`source` of a failed judging's record in `episodes.failures`."""
MAX_JUDGING_ATTEMPTS = 16
"""Failed judgings before the group is dropped: the last episode's task and its 3 retries (tasks.py), then
three reconciler resends with theirs — each a JudgeFault after the judge's own retries."""


@dataclass(frozen=True)
class _Finished:
    group_id: int
    spec: EnvironmentSpec
    instruction: str
    contenders: list[Contender]
    skipped: dict[int, str]
    """Completed episodes that are not compared, and why (each gets a `judge` layer scoring 0 that says so)."""


def judge_finished_group(group_id: int, *, worker: str | None = None) -> bool:
    """Judge the group if it awaits pairwise judging and mark it complete; True if this call did. False when
    there is nothing to do: another episode is still out, it is judged already (perhaps by the worker whose
    lock this call waited for), or it is not a pairwise group — or when the judge failed once too often
    and the group was dropped. A judge failure short of that is a JudgeFault."""
    with _judging_lock(group_id):
        with session_scope() as session:
            finished = _finished_group(session, group_id)
        if finished is None:
            return False
        assert finished.spec.verifier.judge is not None  # a pairwise group has a judge
        judge = Judge(finished.spec.verifier.judge)
        try:
            layers = judge_group(judge, instruction=finished.instruction, contenders=finished.contenders)
        except LearnedRewardUnavailable as error:
            with session_scope() as session:
                dropped = _record_failed_judging(session, finished, error=str(error), worker=worker)
            if dropped:
                return False
            raise JudgeFault(f"group {group_id}: {error}") from error
        finally:
            judge.close()
        layers.update({episode_id: LayerResult(name=LAYER, score=0.0, passed=False, detail=f"not run: {why}")
                       for episode_id, why in finished.skipped.items()})
        with session_scope() as session:
            return _store(session, finished, layers)


def judge_after_failure(episode_id: int, *, worker: str | None = None) -> bool:
    """After an episode failed for good (no retry left): if it was its pairwise group's last one out, judge
    the group now, not at the reconciler's resend. A judge failure here is recorded (as any is) and logged,
    not raised: the episode's task is over, and the reconciler resends the group's judging."""
    group_id = group_of(episode_id)
    if group_id is None:
        return False
    try:
        return judge_finished_group(group_id, worker=worker)
    except JudgeFault as fault:
        logger.warning("episode %s failed for good; judging its group failed too (to be resent): %s", episode_id,
                       fault)
        return False


def group_of(episode_id: int) -> int | None:
    with session_scope() as session:
        return session.execute(select(Episode.group_id).where(Episode.id == episode_id)).scalar_one_or_none()


@contextmanager
def _judging_lock(group_id: int) -> Iterator[None]:
    """A session-level advisory lock on a connection of its own, waited for and held while the judge is
    asked (a holder's wait is bounded: the judge's timeout and retries)."""
    with get_engine().connect() as connection:
        keys = group_lock_keys(group_id)
        connection.execute(text("SELECT pg_advisory_lock(:namespace, :group)"), keys)
        connection.commit()
        try:
            yield
        finally:
            try:
                connection.execute(text("SELECT pg_advisory_unlock(:namespace, :group)"), keys)
                connection.commit()
            except Exception:
                connection.invalidate()  # the server ends that session, and its lock with it


def group_lock_keys(group_id: int) -> dict[str, int]:
    """The two keys of the group's judging lock (pg_advisory_lock(namespace, group))."""
    return {"namespace": LOCK_NAMESPACE, "group": group_id % 2**31}


def _finished_group(session: Session, group_id: int) -> _Finished | None:
    group = session.get(EpisodeGroup, group_id)
    if group is None or group.status != GroupStatus.RUNNING:
        return None
    env_row = session.get(Environment, group.environment_id)
    assert env_row is not None  # foreign key
    spec = spec_of(env_row)
    if spec.verifier.judge is None or spec.verifier.judge.mode != "pairwise":
        return None
    episodes = list(session.execute(
        select(Episode).where(Episode.group_id == group_id).order_by(Episode.sample_index)).scalars())
    if any(episode.status in OUTSTANDING for episode in episodes):
        return None
    contenders, skipped = [], {}
    flag_policy = FlagPolicy.of(spec.verifier)
    for episode in episodes:
        if episode.status != EpisodeStatus.COMPLETED:
            continue  # failed (an infrastructure fault) or cancelled: no outcome to compare, never trained on
        if flag_policy.zeroes(episode.flags):
            skipped[episode.id] = "a hack monitor flagged the episode"
        elif not TerminationReason(episode.termination_reason or TerminationReason.CANCELLED).is_trainable:
            skipped[episode.id] = f"the episode ended {episode.termination_reason} (not trained on)"
        else:
            turns = session.execute(select(Turn).where(Turn.run_id == episode.run_id, Turn.episode_id == episode.id)
                                   .order_by(Turn.index)).scalars()
            contenders.append(Contender(episode.id, transcript_of(list(turns))))
    task = session.get(Task, group.task_id)
    assert task is not None  # foreign key
    return _Finished(group_id=group_id, spec=spec, instruction=task.instruction, contenders=contenders,
                     skipped=skipped)


def _record_failed_judging(session: Session, finished: _Finished, *, error: str, worker: str | None) -> bool:
    """The failed attempt in each of the group's episodes' failures; at MAX_JUDGING_ATTEMPTS, the group
    dropped with the reason recorded beside them. True if it was dropped."""
    group = session.execute(select(EpisodeGroup).where(EpisodeGroup.id == finished.group_id)
                            .with_for_update()).scalar_one()
    episodes = list(session.execute(select(Episode).where(Episode.group_id == finished.group_id)
                                    .order_by(Episode.id).with_for_update()).scalars())
    attempts = 1 + max((judging_attempts(episode) for episode in episodes), default=0)
    record = FailureRecord(reason=JudgeFault.reason.value, source=JUDGING_SOURCE, attempt=attempts, worker=worker,
                           message=f"judging the group failed (attempt {attempts} of {MAX_JUDGING_ATTEMPTS}): "
                                   f"{error}"[-1000:])
    records = [record]
    judge = finished.spec.verifier.judge
    assert judge is not None  # a pairwise group has a judge
    dropped = attempts >= MAX_JUDGING_ATTEMPTS and group.status == GroupStatus.RUNNING
    if dropped:
        group.status = GroupStatus.DROPPED
        why = (f"group {finished.group_id} dropped, never judged: judge {public_url(judge.url)} ({judge.model}) "
               f"failed {attempts} judging attempts; the last: {error}")
        records.append(record.model_copy(update={"attempt": None, "message": why[-1000:]}))
        logger.error("%s", why)
    else:
        logger.warning("group %s: judging attempt %s of %s failed: %s", finished.group_id, attempts,
                       MAX_JUDGING_ATTEMPTS, error)
    for episode in episodes:
        episode.failures = [*episode.failures, *(item.stored() for item in records)]
    return dropped


def judging_attempts(episode: Episode) -> int:
    """Failed judgings of the episode's group so far, as recorded in its failures."""
    return sum(1 for failure in FailureRecord.read_all(episode.failures)
               if failure.source == JUDGING_SOURCE and failure.attempt is not None)


def _store(session: Session, finished: _Finished, layers: dict[int, LayerResult]) -> bool:
    """In one transaction: every judged episode's layer, component, reward and time, then the group complete."""
    group = session.execute(select(EpisodeGroup).where(EpisodeGroup.id == finished.group_id)
                            .with_for_update()).scalar_one()
    if group.status != GroupStatus.RUNNING:  # judged meanwhile (a lock taken after ours was released)
        return False
    episodes = session.execute(select(Episode).where(Episode.id.in_(layers)).with_for_update()).scalars()
    for episode in episodes:
        if any(stored.name == LAYER for stored in LayerRecord.read_all(episode.verifier_layers)):  # never two
            logger.error("group %s: episode %s has a judge layer already; not judged again", finished.group_id,
                         episode.id)
            continue
        layer = layers[episode.id]
        episode.verifier_layers = [*episode.verifier_layers, layer_record(layer)]
        episode.reward_components = {**episode.reward_components, LAYER: layer.score}
        episode.reward = total(episode.reward_components, episode.flags or [], finished.spec).value
        episode.timings = {**(episode.timings or {}), "judge": round(layer.duration_s, 4)}
    group.status = GroupStatus.COMPLETE
    logger.info("group %s judged pairwise: %s", finished.group_id,
                {episode_id: round(layer.score, 3) for episode_id, layer in layers.items()})
    return True
