"""Dispatch: sync and async staleness bounds, in-flight target, budget, eval runs, failed sends."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.config import ControllerConfig
from controller.dispatch import allowance, complete_run_if_done, dispatch_run
from controller.dispatcher import EPISODE_TASK, RecordingDispatcher
from controller.progress import RunProgress, run_progress
from controller.reconcile import reconcile_run
from controller.runs import get_run, stop_run
from core.models import Run
from core.schemas import RunConfig
from tests import factories as f


def _dispatch(session: Session, run_id: int, recorder: RecordingDispatcher, settings: ControllerConfig) -> list[int]:
    return dispatch_run(session, run_id=run_id, dispatcher=recorder, settings=settings).group_ids


def test_sync_mode_dispatches_one_batch_then_waits_for_the_new_version(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    env = f.queued_environment(db_session, timeout_s=300)
    f.tasks(db_session, env, 4)
    run = f.launch(db_session, env, mode="sync", batch_size=2, group_size=3)
    first = _dispatch(db_session, run.id, recorder, settings)
    assert len(first) == 2
    episodes = f.episodes(db_session, run.id)
    assert [e.sample_index for e in episodes] == [0, 1, 2, 0, 1, 2]
    assert {e.status for e in episodes} == {"pending"}
    assert recorder.episode_ids == [e.id for e in episodes]
    assert {(t.name, t.queue) for t in recorder.sent} == {(EPISODE_TASK, "code_repo")}
    now = db_session.execute(select(func.now())).scalar_one()
    for episode in episodes:  # deadline = now + episode_timeout_s (300) + slack (60)
        assert timedelta(seconds=350) < episode.deadline_at - now <= timedelta(seconds=361)
    assert [(g.group_index, g.size, g.policy_version, g.status) for g in f.groups(db_session, run.id)] == [
        (0, 3, 0, "running"), (1, 3, 0, "running")]
    assert get_run(db_session, run_id=run.id).status == "running"

    assert _dispatch(db_session, run.id, recorder, settings) == []  # the batch is in flight
    f.finish_groups(db_session, first)
    result = dispatch_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (result.group_ids, result.limit) == ([], "staleness")  # complete, but not trained on yet
    f.train_step(db_session, run.id)
    second = _dispatch(db_session, run.id, recorder, settings)
    assert len(second) == 2
    assert [g.policy_version for g in f.groups(db_session, run.id)] == [0, 0, 1, 1]


def test_async_mode_keeps_inflight_at_target_within_the_staleness_bound(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 5)
    run = f.launch(db_session, env, mode="async", max_staleness=1, batch_size=2, group_size=1)
    target, rng = 4, random.Random(0)  # (1 + 1) × 2
    for _ in range(40):  # workers finish some groups, the trainer sometimes steps: the bounds always hold
        _dispatch(db_session, run.id, recorder, settings)
        version = get_run(db_session, run_id=run.id).policy_version
        progress, cap = run_progress(db_session, run_id=run.id), (version + 1 + 1) * 2
        assert progress.dispatched <= cap and progress.inflight <= target
        assert progress.inflight == target or progress.dispatched == cap  # never idle below both bounds
        running = [g.id for g in f.groups(db_session, run.id) if g.status == "running"]
        f.finish_groups(db_session, rng.sample(running, rng.randint(0, len(running))))
        if progress.awaiting_trainer + len(running) >= 2 and rng.random() < 0.5:
            f.train_step(db_session, run.id)
    assert get_run(db_session, run_id=run.id).policy_version >= 5


def test_explicit_inflight_cap(db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 2)
    run = f.launch(db_session, env, max_staleness=3, batch_size=2, max_inflight_groups=3)
    first = dispatch_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (len(first.group_ids), first.limit) == (3, "inflight")
    f.finish_groups(db_session, first.group_ids[:1])
    assert len(_dispatch(db_session, run.id, recorder, settings)) == 1


def test_budget_then_completed_once_consumed(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 2)
    run = f.launch(db_session, env, max_staleness=1, batch_size=2, max_groups=3)
    result = dispatch_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (len(result.group_ids), result.limit) == (3, "budget")
    f.finish_groups(db_session, result.group_ids)
    assert not complete_run_if_done(db_session, run_id=run.id)  # complete, not yet trained on
    f.train_step(db_session, run.id)
    assert _dispatch(db_session, run.id, recorder, settings) == []
    assert complete_run_if_done(db_session, run_id=run.id)
    run = get_run(db_session, run_id=run.id)
    assert run.status == "completed" and run.finished_at is not None


def test_eval_runs_ignore_the_version_bound(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 3)
    run = f.launch(db_session, env, purpose="eval", mode="sync", batch_size=1, max_inflight_groups=4, max_groups=6)
    first = _dispatch(db_session, run.id, recorder, settings)
    assert len(first) == 4  # a train run would stop at (0 + 0 + 1) × 1
    f.finish_groups(db_session, first)
    second = _dispatch(db_session, run.id, recorder, settings)
    assert len(second) == 2
    f.finish_groups(db_session, second)
    assert complete_run_if_done(db_session, run_id=run.id)  # nobody trains on eval groups


def test_stopped_runs_are_not_dispatched(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 1)
    run = f.launch(db_session, env)
    stop_run(db_session, run_id=run.id)
    db_session.commit()
    result = dispatch_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings)
    assert (result.group_ids, result.limit, recorder.sent) == ([], "inactive", [])


def test_a_failed_send_leaves_episodes_pending_and_the_reconciler_sends_them(
    db_session: Session, settings: ControllerConfig
) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 2)
    run = f.launch(db_session, env, group_size=3)
    broken = RecordingDispatcher(fail=True)
    result = dispatch_run(db_session, run_id=run.id, dispatcher=broken, settings=settings)
    assert (len(result.group_ids), result.limit) == (1, "send_failed")  # stops at the first failure
    episodes = f.episodes(db_session, run.id)
    assert [(e.status, e.deadline_at) for e in episodes] == [("pending", None)] * 3
    broken.fail = False
    reconciled = reconcile_run(db_session, run_id=run.id, dispatcher=broken, settings=settings)
    assert sorted(reconciled.resent) == sorted(broken.episode_ids) == [e.id for e in episodes]
    assert all(e.deadline_at is not None and e.attempts == 0 for e in f.episodes(db_session, run.id))


@pytest.mark.parametrize("reason", ["zero_variance", "stale_cap", None])
def test_groups_the_trainer_dropped_are_replaced_within_the_version_bound(db_session, engine, reason) -> None:
    """Dynamic sampling drops zero-variance groups; the run must get fresh ones, not stall. A group dropped
    past the staleness cap (or before drop reasons were stored) is never trained on either: replaced too."""
    from controller.config import ControllerConfig
    from controller.dispatch import dispatch_run
    from controller.dispatcher import RecordingDispatcher
    from core.models import EpisodeGroup
    from tests import factories as f

    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 4)
    run = f.launch(db_session, env, mode="async", batch_size=2, group_size=1, max_staleness=0)
    dispatcher = RecordingDispatcher()
    first = dispatch_run(db_session, run_id=run.id, dispatcher=dispatcher, settings=ControllerConfig())
    assert len(first.group_ids) == 2  # (version 0 + bound 0 + 1) x batch 2
    assert dispatch_run(db_session, run_id=run.id, dispatcher=dispatcher, settings=ControllerConfig()).group_ids == []
    dropped = db_session.get(EpisodeGroup, first.group_ids[0])
    dropped.status, dropped.drop_reason = "dropped", reason
    db_session.commit()
    again = dispatch_run(db_session, run_id=run.id, dispatcher=dispatcher, settings=ControllerConfig())
    assert len(again.group_ids) == 1  # the dropped group is replaced, nothing more


@pytest.mark.parametrize(("staleness", "batch"), [(1, 4), (2, 3)])
def test_stale_cap_drops_leave_the_admission_window_whole(staleness: int, batch: int) -> None:
    """Issue 47, item 4: a stale-cap drop held its admission slot for good, so after η·B of them the window
    for groups not yet consumed was B and the async run synchronous (η = 1, B = 4: 8, 7, …, 0 as the drops
    went 0 → 8). Whatever the drops so far, at every version, the window stays (η + 1)·B minus what runs."""
    config = RunConfig(name="r", model="m", environments=[{"name": "e"}], batch_size=batch,
                       max_staleness=staleness, max_inflight_groups=1000)
    for version in (0, 1, 5):
        run = Run(purpose="train", max_staleness=staleness, batch_size=batch, policy_version=version)
        for drops in range(staleness * batch + 3):
            for running in (0, 1, batch):
                progress = RunProgress(groups={"consumed": version * batch, "dropped": drops, "running": running},
                                       drop_reasons={"stale_cap": drops} if drops else {})
                room = allowance(run=run, config=config, progress=progress)
                assert (room.groups, room.limit) == ((staleness + 1) * batch - running, "staleness"), (version, drops)


def test_longest_first_sends_the_slow_tasks_of_a_pass_first(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    """Issue 23: the groups one pass may dispatch are sent longest-expected first (an unmeasured task
    first of all); group indexes, hence consumption order, stay the pick order."""
    env = f.queued_environment(db_session)
    tasks = f.tasks(db_session, env, 4)
    for task, seconds in zip(tasks, [1.0, 30.0, None, 5.0], strict=True):
        task.episode_seconds = seconds
    db_session.commit()
    run = f.launch(db_session, env, mode="async", max_staleness=1, batch_size=2, group_size=1,
                   dispatch_order="longest_first", curriculum={"readmit_rate": 0})
    created = _dispatch(db_session, run.id, recorder, settings)
    assert len(created) == 4  # (0 + 1 + 1) × 2
    task_of = {e.id: e.task_id for e in f.episodes(db_session, run.id)}
    seconds = {t.id: t.episode_seconds for t in tasks}
    sent = [seconds[task_of[episode_id]] for episode_id in recorder.episode_ids]
    assert sent == [None, 30.0, 5.0, 1.0]
    assert [g.group_index for g in f.groups(db_session, run.id)] == [0, 1, 2, 3]
    plain = f.launch(db_session, env, mode="async", max_staleness=1, batch_size=2, group_size=1)
    before = len(recorder.episode_ids)
    _dispatch(db_session, plain.id, recorder, settings)
    plain_task_of = {e.id: e.task_id for e in f.episodes(db_session, plain.id)}
    order = [g.task_id for g in f.groups(db_session, plain.id)]
    assert [plain_task_of[e] for e in recorder.episode_ids[before:]] == order  # pick order, as before
