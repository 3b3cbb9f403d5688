"""Reconciliation: lost episodes are redispatched (bounded), slow and queued ones are left alone,
never-sent ones are sent, finished groups are marked complete."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from controller.config import ControllerConfig, stored_run_config
from controller.dispatch import create_group, dispatch_run
from controller.dispatcher import RecordingDispatcher
from controller.reconcile import reconcile_run
from core.models import Episode, Run
from tests import factories as f


def _run(session: Session, **config: object) -> Run:
    env = f.queued_environment(session)
    f.tasks(session, env, 3)
    return f.launch(session, env, mode="async", group_size=2, batch_size=1, **config)


def _dispatch_one(session: Session, run: Run, settings: ControllerConfig) -> list[int]:
    """Dispatch one group and return its episode ids."""
    recorder = RecordingDispatcher()
    dispatch_run(session, run_id=run.id, dispatcher=recorder, settings=settings.model_copy(
        update={"max_groups_per_pass": 1}))
    return recorder.episode_ids


def _now(session: Session) -> datetime:
    return session.execute(select(func.now())).scalar_one()


def test_episodes_of_a_dead_worker_are_redispatched(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    run = _run(db_session)
    ids = _dispatch_one(db_session, run, settings)
    f.worker(db_session, "w-dead", age_s=120)  # heartbeat older than heartbeat_timeout_s (30)
    f.start(db_session, ids, worker="w-dead", overdue=True)
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert sorted(result.resent) == sorted(recorder.episode_ids) == ids
    now = _now(db_session)
    for episode in f.episodes(db_session, run.id):
        assert (episode.status, episode.attempts, episode.worker, episode.started_at) == ("pending", 1, None, None)
        assert episode.deadline_at > now
        [failure] = episode.failures
        assert (failure["reason"], failure["worker"], failure["status"]) == ("worker_lost", "w-dead", "running")
        assert datetime.fromisoformat(failure["at"]) <= now


def test_gives_up_after_max_attempts_and_completes_the_group(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    run = _run(db_session)
    lost, done = _dispatch_one(db_session, run, settings)
    db_session.execute(update(Episode).where(Episode.id == done).values(status="completed", reward=1.0,
                                                                      termination_reason="submitted"))
    db_session.commit()
    for attempt in range(settings.max_attempts):
        f.start(db_session, [lost], worker=f"w-{attempt}", overdue=True)  # no worker row: unknown = dead
        result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (result.failed, result.groups_completed) == ([lost], 1)
    assert recorder.episode_ids == [lost] * (settings.max_attempts - 1)  # the last loss is not re-sent
    episode = next(e for e in f.episodes(db_session, run.id) if e.id == lost)
    assert (episode.status, episode.termination_reason, episode.attempts) == ("failed", "worker_lost", 3)
    assert [item["worker"] for item in episode.failures] == ["w-0", "w-1", "w-2"]
    assert f.groups(db_session, run.id)[0].status == "complete"


def test_a_slow_episode_on_a_live_worker_is_left_alone(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    run = _run(db_session)
    ids = _dispatch_one(db_session, run, settings)
    f.worker(db_session, "w-alive", age_s=1)
    f.start(db_session, ids, worker="w-alive", overdue=True)
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (sorted(result.slow), result.resent, recorder.sent) == (ids, [], [])
    assert {(e.status, e.attempts, e.failures == []) for e in f.episodes(db_session, run.id)} == {("running", 0, True)}


def test_a_stopped_worker_is_dead_even_with_a_fresh_heartbeat(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    run = _run(db_session)
    ids = _dispatch_one(db_session, run, settings)
    f.worker(db_session, "w-stopped", stopped=True)
    f.start(db_session, ids, worker="w-stopped", overdue=True)
    assert sorted(reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings).resent) == ids


def test_a_worker_restarted_under_its_name_loses_its_predecessors_episodes_at_once(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    """(issue 24) compose restarts a killed worker with the same hostname, so the same name beats again at
    once: the episodes its previous incarnation leased are requeued on the next pass, long before their
    deadline, and the new incarnation's own are left alone."""
    run = _run(db_session)
    theirs, mine = _dispatch_one(db_session, run, settings)
    f.worker(db_session, "w", incarnation="second", age_s=1)  # the restart took the row over
    f.start(db_session, [theirs], worker="w", incarnation="first")
    f.start(db_session, [mine], worker="w", incarnation="second")
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (result.orphaned, result.resent, recorder.episode_ids) == ([theirs], [theirs], [theirs])
    lost, kept = f.episodes(db_session, run.id)
    assert (lost.status, lost.worker, lost.worker_incarnation, lost.attempts) == ("pending", None, None, 1)
    assert [(item["reason"], item["worker"], item["incarnation"]) for item in lost.failures] == [
        ("worker_lost", "w", "first")]
    assert (kept.status, kept.worker_incarnation, kept.failures) == ("running", "second", [])
    # The next pass finds nothing more to do: the requeued one is pending, the running one is alive.
    again = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (again.orphaned, again.resent) == ([], [])


@pytest.mark.parametrize("gone", ["stale", "stopped"])
def test_an_incarnation_whose_heartbeat_stopped_loses_its_episodes_before_their_deadline(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig, gone: str
) -> None:
    run = _run(db_session)
    ids = _dispatch_one(db_session, run, settings)
    f.worker(db_session, "w", incarnation="only", age_s=120 if gone == "stale" else 1, stopped=gone == "stopped")
    f.start(db_session, ids, worker="w", incarnation="only")
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert sorted(result.orphaned) == sorted(result.resent) == ids


def test_an_overdue_episode_of_a_live_incarnation_is_slow_and_one_without_an_incarnation_waits_for_its_deadline(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    run = _run(db_session)
    slow, legacy = _dispatch_one(db_session, run, settings)
    f.worker(db_session, "w", incarnation="now", age_s=1)
    f.start(db_session, [slow], worker="w", incarnation="now", overdue=True)
    # Leased outside a worker (no heartbeat, no incarnation) under a name that beats: the name decides.
    f.start(db_session, [legacy], worker="w")
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (result.slow, result.orphaned, result.resent) == ([slow], [], [])


def test_episodes_never_sent_are_sent_once_overdue(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    run = _run(db_session)
    new = create_group(db_session, run=run, config=stored_run_config(run), settings=settings)
    db_session.commit()  # … and the controller died before sending
    f.worker(db_session, "w-idle")  # alive, serving the queue, running nothing
    assert reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings).resent == []
    f.make_overdue(db_session, new.episode_ids)
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert sorted(result.resent) == sorted(recorder.episode_ids) == new.episode_ids
    assert {(e.status, e.attempts) for e in f.episodes(db_session, run.id)} == {("pending", 1)}


def test_overdue_unstarted_episodes_behind_earlier_work_stay_queued(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    run = _run(db_session, max_inflight_groups=3, max_staleness=2)
    earlier = _dispatch_one(db_session, run, settings)
    waiting = _dispatch_one(db_session, run, settings)
    later = _dispatch_one(db_session, run, settings)
    assert len(earlier) == len(waiting) == len(later) == 2
    f.make_overdue(db_session, earlier, seconds=20)
    f.make_overdue(db_session, waiting, seconds=10)  # sent after `earlier`, before `later`
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (sorted(result.queued), result.resent) == (sorted(earlier + waiting), [])  # no live worker: wait

    f.worker(db_session, "w-busy")
    f.start(db_session, earlier, worker="w-busy")  # the worker is busy with work sent before `waiting`
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (sorted(result.queued), result.resent) == (waiting, [])

    f.start(db_session, later, worker="w-busy")  # a message sent after `waiting` got a worker first
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (sorted(result.resent), result.queued) == (waiting, [])


def test_groups_whose_episodes_all_ended_are_marked_complete(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    run = _run(db_session)
    ids = _dispatch_one(db_session, run, settings)
    db_session.execute(update(Episode).where(Episode.id.in_(ids)).values(status="completed", reward=0.0,
                                                                       termination_reason="max_turns"))
    db_session.commit()  # a worker that stored the episodes but died before marking the group
    assert reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings).groups_completed == 1
    assert f.groups(db_session, run.id)[0].status == "complete"


def test_an_episode_awaiting_its_judge_is_sent_again_until_the_runs_patience_then_fails_judge_error(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    """(issue 50) A played episode whose judge did not answer (`scoring`) is resent when its next ask is due —
    its task judges it from the store — and its group waits; past the run's judge_patience_s since its play
    ended it fails `judge_error`, and only then does the group complete. Never before: a judge restarted
    for a deploy loses nothing."""
    from datetime import timedelta

    run = _run(db_session, judge_patience_s=60)
    waiting, gone = _dispatch_one(db_session, run, settings)
    now = _now(db_session)
    for episode_id, ended_s_ago in ((waiting, 10), (gone, 61)):
        db_session.execute(update(Episode).where(Episode.id == episode_id).values(
            status="scoring", termination_reason="submitted", reward=None, reward_components={"hidden_tests": 1.0},
            finished_at=now - timedelta(seconds=ended_s_ago), deadline_at=now - timedelta(seconds=1)))
    db_session.commit()
    recorder.sent.clear()
    result = reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (result.rescoring, result.unscored, recorder.episode_ids) == ([waiting], [gone], [waiting])
    assert result.groups_completed == 0 and f.groups(db_session, run.id)[0].status == "running"
    by_id = {episode.id: episode for episode in f.episodes(db_session, run.id)}
    assert (by_id[waiting].status, by_id[waiting].attempts) == ("scoring", 0)  # never re-played
    assert by_id[waiting].deadline_at > _now(db_session)  # due again later, not at every pass
    assert (by_id[gone].status, by_id[gone].termination_reason, by_id[gone].reward) == ("failed", "judge_error", None)
    assert "judge_patience_s (60 s)" in by_id[gone].failures[-1]["message"]
    recorder.sent.clear()
    assert reconcile_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings).rescoring == []
    assert recorder.sent == []
