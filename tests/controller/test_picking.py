"""Task picking: environment weights, split, pass-rate band, bucket weights, coverage, determinism."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from controller.config import ControllerConfig, stored_run_config
from controller.dispatch import create_group
from controller.errors import NoEligibleTask
from controller.picking import pick_task
from core.models import Run, Task
from tests import factories as f


def _picks(session: Session, run: Run, count: int) -> list[tuple[str, int, str]]:
    config = stored_run_config(run)
    picks = [pick_task(session, run_id=run.id, config=config, group_index=index) for index in range(count)]
    return [(pick.environment.name, pick.task_id, pick.bucket) for pick in picks]


def test_environments_are_drawn_by_weight_deterministically(db_session: Session) -> None:
    heavy, light = f.queued_environment(db_session, name="heavy"), f.queued_environment(db_session, name="light")
    f.tasks(db_session, heavy, 3)
    f.tasks(db_session, light, 3)
    run = f.launch(db_session, [heavy, light], seed=7,
                   environments=[{"name": "heavy", "weight": 3.0}, {"name": "light", "weight": 1.0}])
    picks = _picks(db_session, run, 400)
    share = Counter(name for name, _, _ in picks)
    assert 250 <= share["heavy"] <= 350, share  # 3:1 → about 300 of 400
    assert picks == _picks(db_session, run, 400)  # same seed, same group indices, same picks
    other = f.launch(db_session, [heavy, light], seed=8)
    assert _picks(db_session, other, 50) != picks[:50]


def test_split_and_pass_rate_band_exclude_tasks(db_session: Session) -> None:
    env = f.queued_environment(db_session)
    inside = f.tasks(db_session, env, 1, pass_rate=0.5, difficulty="medium")[0]
    unmeasured = f.tasks(db_session, env, 1)[0]
    f.tasks(db_session, env, 1, pass_rate=0.05, difficulty="hard")  # below the band
    f.tasks(db_session, env, 1, pass_rate=0.95, difficulty="easy")  # above it
    f.tasks(db_session, env, 1, split="test")
    run = f.launch(db_session, env, curriculum={"pass_rate_band": [0.1, 0.9], "readmit_rate": 0})
    assert {task_id for _, task_id, _ in _picks(db_session, run, 60)} == {inside.id, unmeasured.id}


def test_tasks_outside_the_band_are_readmitted_at_a_small_rate_to_be_measured_again(db_session: Session) -> None:
    """Without readmission a task the policy stopped solving (or always solves) leaves the band for good:
    its pass rate is only updated from groups the trainer examines, and it is never drawn again."""
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 3, pass_rate=0.5, difficulty="medium")
    outside = {t.id for t in f.tasks(db_session, env, 2, pass_rate=0.0, difficulty="hard")}
    run = f.launch(db_session, env, curriculum={"pass_rate_band": [0.1, 0.9], "readmit_rate": 0.1})
    picks = _picks(db_session, run, 400)
    readmitted = [task_id for _, task_id, bucket in picks if bucket == "readmitted"]
    assert 20 <= len(readmitted) <= 60 and set(readmitted) == outside  # about 40 of 400, both re-measured
    assert all(task_id not in outside for _, task_id, bucket in picks if bucket != "readmitted")
    assert picks == _picks(db_session, run, 400)  # deterministic, like every pick


def test_buckets_are_drawn_by_weight_and_zero_weight_buckets_never(db_session: Session) -> None:
    env = f.queued_environment(db_session)
    for difficulty in ("easy", "medium", "hard"):
        f.tasks(db_session, env, 2, pass_rate=0.5, difficulty=difficulty)
    f.tasks(db_session, env, 2)  # unknown
    weights = {"easy": 1.0, "medium": 0.0, "hard": 3.0, "unknown": 0.0}
    run = f.launch(db_session, env, curriculum={"pass_rate_band": [0.0, 1.0], "bucket_weights": weights})
    buckets = Counter(bucket for _, _, bucket in _picks(db_session, run, 400))
    assert set(buckets) == {"easy", "hard"}
    assert 250 <= buckets["hard"] <= 350, buckets


def test_least_used_tasks_come_first(db_session: Session, settings: ControllerConfig) -> None:
    env = f.queued_environment(db_session)
    tasks = f.tasks(db_session, env, 5)
    run = f.launch(db_session, env, max_groups=100)
    config = stored_run_config(run)
    used = []
    for _ in range(10):
        used.append(create_group(db_session, run=run, config=config, settings=settings))
    db_session.commit()
    groups = f.groups(db_session, run.id)
    first, second = [g.task_id for g in groups[:5]], [g.task_id for g in groups[5:]]
    assert sorted(first) == sorted(second) == sorted(task.id for task in tasks)  # full coverage, twice
    assert [g.group_index for g in groups] == list(range(10))


def test_no_eligible_task_is_a_clear_error(db_session: Session) -> None:
    env = f.queued_environment(db_session, name="alpha")
    f.tasks(db_session, env, 3)
    run = f.launch(db_session, env)
    db_session.execute(update(Task).values(pass_rate=1.0, difficulty="easy"))  # all measured: too easy
    db_session.commit()
    with pytest.raises(NoEligibleTask, match=r"environment 'alpha' has no eligible task in split 'train': of its "
                                             r"3 tasks none has a pass rate in the band \[0.1, 0.9\]"):
        _picks(db_session, run, 1)
