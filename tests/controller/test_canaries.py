"""Hack canaries mixed into a run (core/canaries.py, controller/canaries.py): at the run's rate, by a
deterministic draw per group, a code_repo group's task is the picked task marked `canary` (its payload
otherwise the task's own, stored once, in the split `canary:<split>`); other kinds, tasks without a
reference solution and a zero rate never get one."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.canaries import is_canary_group
from controller.config import ControllerConfig, stored_run_config
from controller.dispatch import create_group
from core.canaries import is_canary
from core.models import Task
from tests import factories as f

HIDDEN = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
PAYLOAD = {"repo": {"format": "tar", "data_b64": ""}, "hidden_tests": {"files": {"test_hidden.py": HIDDEN}},
           "solution": {"files": {"calc.py": "def add(a, b):\n    return a + b\n"}}}


def _groups(session: Session, *, rate: float, kind: str = "code_repo", count: int = 40,
            settings: ControllerConfig, payload: dict | None = None, after: int = 0) -> list[Task]:
    env = f.queued_environment(session, kind=kind)
    f.tasks(session, env, 3, payload=payload or PAYLOAD)
    run = f.launch(session, env, max_groups=1000, canary_rate=rate, canary_after=after)
    config = stored_run_config(run)
    for _ in range(count):
        create_group(session, run=run, config=config, settings=settings)
    session.commit()
    return [session.get(Task, group.task_id) for group in f.groups(session, run.id)]


def test_canaries_are_mixed_in_at_the_runs_rate(db_session: Session, settings: ControllerConfig) -> None:
    tasks = _groups(db_session, rate=0.25, settings=settings)
    canaries = [task for task in tasks if is_canary(task.split)]
    assert 3 <= len(canaries) <= 20  # 40 draws at 0.25
    for task in canaries:
        assert task.split == "canary:train" and task.external_id.startswith("canary:")
        assert task.payload["canary"] is True  # everything else is the task's: the same files reach the sandbox
        source = db_session.get(Task, next(t.id for t in tasks if not is_canary(t.split)
                                           and t.external_id == task.external_id.removeprefix("canary:")))
        assert {**task.payload, "canary": False} == {**source.payload, "canary": False}
    # One stored variant per source task, however often it is drawn.
    stored = db_session.execute(select(Task).where(Task.split == "canary:train")).scalars().all()
    assert len(stored) == len({task.id for task in canaries}) <= 3


def test_no_canary_at_rate_zero_or_for_other_kinds(db_session: Session, settings: ControllerConfig) -> None:
    assert not any(is_canary(t.split) for t in _groups(db_session, rate=0.0, count=10, settings=settings))
    unsolved = {**PAYLOAD, "solution": None}  # no reference solution: no key to perturb
    assert not any(is_canary(t.split) for t in _groups(db_session, rate=0.5, count=10, settings=settings,
                                                       payload=unsolved))
    assert not any(is_canary(t.split) for t in _groups(db_session, rate=0.5, kind="read_number", count=10,
                                                       settings=settings))


def test_the_draw_is_deterministic_per_run_seed_and_group() -> None:
    draws = [is_canary_group(run_id=7, seed=0, group_index=i, rate=0.1) for i in range(2000)]
    assert draws == [is_canary_group(run_id=7, seed=0, group_index=i, rate=0.1) for i in range(2000)]
    assert 140 <= sum(draws) <= 260
    assert not any(is_canary_group(run_id=7, seed=0, group_index=i, rate=0.0) for i in range(100))


def test_by_default_a_run_mixes_canaries_in_after_its_first_groups(db_session: Session, settings: ControllerConfig) -> None:
    """The defaults (a 2 % rate after 32 groups): none among the first 32, some among the next 200."""
    from core.schemas import RunConfig

    defaults = RunConfig.model_fields
    assert defaults["canary_rate"].default == 0.02 and defaults["canary_after"].default == 32
    tasks = _groups(db_session, rate=0.02, count=232, settings=settings, after=32)
    assert not any(is_canary(t.split) for t in tasks[:32])
    assert 1 <= sum(is_canary(t.split) for t in tasks[32:]) <= 15
