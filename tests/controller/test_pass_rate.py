"""Pass-rate jobs: one group of N per task; recorded rates and buckets count agent outcomes only;
the curriculum then draws by them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from controller.config import ControllerConfig, stored_run_config
from controller.dispatcher import RecordingDispatcher
from controller.errors import InvalidRunState
from controller.loop import Controller
from controller.pass_rate import DifficultyThresholds, launch_pass_rate_job, record_pass_rates
from controller.picking import pick_task
from controller.reconcile import complete_finished_groups
from controller.runs import get_run
from core.models import Environment, Episode, Task
from tests import factories as f


@pytest.fixture
def controller(engine: Engine, recorder: RecordingDispatcher, settings: ControllerConfig) -> Iterator[Controller]:
    loop = Controller(engine=engine, dispatcher=recorder, settings=settings, name="test")
    yield loop
    loop.close()


def _outcomes(session: Session, task: Task, outcomes: list[tuple[str, str, float]]) -> None:
    """Set (status, termination reason, reward) on the task's episodes, in sample order."""
    episodes = [e for e in session.query(Episode).filter(Episode.task_id == task.id).order_by(Episode.sample_index)]
    assert len(episodes) == len(outcomes)
    for episode, (status, reason, reward) in zip(episodes, outcomes, strict=True):
        episode.status, episode.termination_reason, episode.reward = status, reason, reward
        episode.reward_components = {"hidden_tests": reward}
    session.commit()


def _job(session: Session) -> tuple[Environment, list[Task]]:
    env = f.queued_environment(session, name="bugs")
    tasks = f.tasks(session, env, 3)
    f.tasks(session, env, 2, split="test")
    session.commit()
    return env, tasks


def test_a_job_samples_every_task_of_the_split_once_and_records_rates(
    db_session: Session, controller: Controller, recorder: RecordingDispatcher
) -> None:
    env, (easy, medium, hard) = _job(db_session)
    run = launch_pass_rate_job(db_session, environment="bugs", samples_per_task=4, model="tiny")
    db_session.commit()
    assert (run.purpose, run.group_size, stored_run_config(run).max_groups) == ("pass_rate", 4, 3)
    assert controller.step().dispatched == {run.id: 3}
    assert sorted(g.task_id for g in f.groups(db_session, run.id)) == [easy.id, medium.id, hard.id]
    assert len(recorder.sent) == 12

    ok, fail, lost = ("completed", "submitted", 1.0), ("completed", "max_turns", 0.0), ("failed", "sandbox_error", 0.0)
    _outcomes(db_session, easy, [ok, ok, ok, fail])  # 3/4
    _outcomes(db_session, medium, [ok, fail, fail, lost])  # 1/3: the sandbox fault is not counted
    _outcomes(db_session, hard, [fail, fail, fail, ("completed", "format_error", 0.0)])  # 0/4
    with pytest.raises(InvalidRunState, match=r"3 groups still running"):
        record_pass_rates(db_session, run_id=run.id)

    report = controller.step()  # reconcile completes the groups; the run is done; rates recorded
    assert report.finished == [run.id]
    assert get_run(db_session, run_id=run.id).status == "completed"
    db_session.expire_all()
    rows = {t.id: (t.pass_rate, t.pass_rate_samples, t.pass_rate_policy_version, t.difficulty)
            for t in (easy, medium, hard)}
    assert rows == {easy.id: (0.75, 4, 0, "easy"), medium.id: (pytest.approx(1 / 3), 3, 0, "medium"),
                    hard.id: (0.0, 4, 0, "hard")}

    training = f.launch(db_session, env, curriculum={"pass_rate_band": [0.1, 0.9], "readmit_rate": 0})
    config = stored_run_config(training)
    picked = {pick_task(db_session, run_id=training.id, config=config, group_index=i).task_id for i in range(20)}
    assert picked == {easy.id, medium.id}  # hard (0.0) is outside the band (and readmission is off)
    assert {t.pass_rate_rule["threshold"] for t in (easy, medium, hard)} == {1.0}  # type: ignore[index]


def test_success_by_component_and_custom_buckets(db_session: Session, controller: Controller) -> None:
    _, tasks = _job(db_session)
    run = launch_pass_rate_job(db_session, environment="bugs", samples_per_task=2, model="tiny",
                               component="hidden_tests", success_threshold=0.5)
    db_session.commit()
    controller.step()
    for task, scores in zip(tasks, ([0.5, 0.9], [0.4, 0.6], [0.0, 0.1]), strict=True):
        _outcomes(db_session, task, [("completed", "submitted", score) for score in scores])
    db_session.execute(update(Episode).values(reward=0.0))  # the total reward is not what is scored
    complete_finished_groups(db_session, run_id=run.id)
    results = record_pass_rates(db_session, run_id=run.id, component="hidden_tests", success_threshold=0.5,
                                thresholds=DifficultyThresholds(easy_at=0.9, hard_below=0.5))
    assert [(r.pass_rate, r.difficulty) for r in results] == [(1.0, "easy"), (0.5, "medium"), (0.0, "hard")]


def test_only_pass_rate_runs_are_recorded(db_session: Session) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 1)
    run = f.launch(db_session, env)
    with pytest.raises(InvalidRunState, match=r"has purpose 'train'; expected a 'pass_rate' run"):
        record_pass_rates(db_session, run_id=run.id)


@pytest.mark.parametrize("purpose", ["pass_rate", "eval"])
def test_a_measurement_covers_every_task_once_whatever_the_buckets(
    db_session: Session, controller: Controller, purpose: str,
) -> None:
    """Measuring again after a first measurement: one task is `easy`, five are not measured. Drawing a bucket
    first (as a train run's curriculum does) would give the lone easy task about half the groups; a
    measurement takes the least-used task of any bucket instead, so each task gets exactly one group."""
    from controller.evaluation import launch_eval

    env = f.queued_environment(db_session, name="remeasured")
    tasks = f.tasks(db_session, env, 6, split="test")
    tasks[0].difficulty, tasks[0].pass_rate = "easy", 0.9
    db_session.commit()
    if purpose == "eval":
        run = launch_eval(db_session, model="tiny", environment="remeasured", samples_per_task=2)
    else:
        run = launch_pass_rate_job(db_session, environment="remeasured", split="test", samples_per_task=2, model="tiny")
    db_session.commit()
    assert controller.step().dispatched == {run.id: 6}
    assert sorted(g.task_id for g in f.groups(db_session, run.id)) == sorted(t.id for t in tasks)
