"""The trainer stores each step's run-page point (`core.step_points`) with the step, in the step
transaction: exactly the step's consumed groups, the same numbers the API would compute, JSON-safe."""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import Engine, null, select, update
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.main import app as cli
from core.models import Episode, TrainingStep
from core.step_points import empty_point, episode_points
from tests.factories import add_group, make_environment, make_run
from trainer.store import record_step


def _points(session: Session, run_id: int) -> dict[int, Any]:
    session.expire_all()
    rows = session.execute(select(TrainingStep.step, TrainingStep.points).where(TrainingStep.run_id == run_id))
    return {step: points for step, points in rows}


def test_each_step_stores_the_point_of_exactly_its_consumed_groups(db_session: Session, engine: Engine) -> None:
    run = make_run(db_session, model="unused")
    env, task = make_environment(db_session, name="numbers")
    first = [add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0, 0.5], failed=(2,)),
             add_group(db_session, run=run, env=env, task=task, rewards=[0.0, 1.0])]
    second = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 1.0])
    left = add_group(db_session, run=run, env=env, task=task, rewards=[0.0, 0.0])
    db_session.commit()
    with Session(engine) as step_session:
        record_step(step_session, run_id=run.id, step=1, policy_version=1, consumed=[g.id for g in first],
                    dropped={}, metrics={"loss/policy": 0.1})
        assert _points(db_session, run.id) == {}  # nothing visible before the commit
        step_session.commit()
        record_step(step_session, run_id=run.id, step=2, policy_version=2, consumed=[second.id], dropped={},
                    metrics={})
        step_session.commit()
        record_step(step_session, run_id=run.id, step=3, policy_version=3, consumed=[], dropped={left.id: "zero_variance"}, metrics={})
        step_session.commit()
    stored = _points(db_session, run.id)
    assert stored[1] == {  # 5 ended episodes (the sandbox fault has no reward): rewards 1, 0, 0, 1
        "x": 1, "episodes": 5, "reward_mean": 0.5, "reward_std": 0.5, "reward_min": 0.0, "reward_max": 1.0,
        "by_environment": {"numbers": 0.5}, "components": {"answer": 0.5},
        "termination": {"submitted": 4, "sandbox_error": 1},
    }
    assert (stored[2]["episodes"], stored[2]["reward_mean"], stored[2]["termination"]) == (2, 1.0, {"submitted": 2})
    assert stored[3] == empty_point(3)  # a step that dropped its only group trained on no episode
    computed = episode_points(db_session, run_id=run.id, axis="step")  # what the API computes from the episodes
    assert {1: stored[1], 2: stored[2]} == computed


def test_a_rolled_back_step_leaves_no_point(db_session: Session, engine: Engine) -> None:
    run = make_run(db_session, model="unused")
    env, task = make_environment(db_session)
    group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0])
    db_session.commit()
    with Session(engine) as step_session:
        record_step(step_session, run_id=run.id, step=1, policy_version=1, consumed=[group.id], dropped={}, metrics={})
        step_session.rollback()  # a trainer killed before its commit
    assert _points(db_session, run.id) == {}


def test_non_finite_rewards_are_stored_as_null(db_session: Session, engine: Engine) -> None:
    run = make_run(db_session, model="unused")
    env, task = make_environment(db_session)
    nan_group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0])
    inf_group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0])
    db_session.execute(update(Episode).where(Episode.group_id == nan_group.id, Episode.sample_index == 0)
                       .values(reward=float("nan")))
    db_session.execute(update(Episode).where(Episode.group_id == inf_group.id, Episode.sample_index == 0)
                       .values(reward=float("inf")))
    db_session.commit()
    with Session(engine) as step_session:
        record_step(step_session, run_id=run.id, step=1, policy_version=1, consumed=[nan_group.id], dropped={},
                    metrics={})
        record_step(step_session, run_id=run.id, step=2, policy_version=2, consumed=[inf_group.id], dropped={},
                    metrics={})
        step_session.commit()
    stored = _points(db_session, run.id)
    for point in stored.values():
        assert point is not None and point["episodes"] == 2
        json.dumps(point, allow_nan=False)  # strict JSON: no NaN or Infinity anywhere
        assert point["reward_mean"] is None and point["reward_std"] is None
        assert all(v is None or math.isfinite(v) for v in (point["reward_min"], point["reward_max"]))


def test_crucible_runs_points_stores_what_the_trainer_would_have(db_session: Session, engine: Engine) -> None:
    """Steps recorded before the trainer kept points (NULL, migration 0008) get exactly the points the
    trainer stores: `crucible runs points` fills them once, and says so; a run it does not know is an error."""
    run = make_run(db_session, model="unused")
    env, task = make_environment(db_session, name="numbers")
    groups = [add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0, 0.5]),
              add_group(db_session, run=run, env=env, task=task, rewards=[0.25, 0.75])]
    db_session.commit()
    with Session(engine) as step_session:
        for step, group in enumerate(groups, start=1):
            record_step(step_session, run_id=run.id, step=step, policy_version=step, consumed=[group.id], dropped={},
                        metrics={})
            step_session.commit()
        record_step(step_session, run_id=run.id, step=3, policy_version=3, consumed=[], dropped={}, metrics={})
        step_session.commit()
    stored = _points(db_session, run.id)
    db_session.execute(update(TrainingStep).where(TrainingStep.run_id == run.id).values(points=null()))  # SQL NULL
    db_session.commit()

    runner = CliRunner()
    filled = runner.invoke(cli, ["runs", "points", str(run.id), "-o", "json"])
    assert filled.exit_code == 0, filled.output
    assert json.loads(filled.output) == {"steps_filled": {str(run.id): 3}}
    assert _points(db_session, run.id) == stored and stored[3] == empty_point(3)
    again = runner.invoke(cli, ["runs", "points"])
    assert again.exit_code == 0 and "already has its stored point" in again.output
    unknown = runner.invoke(cli, ["runs", "points", "999999"])
    assert unknown.exit_code == 2 and "no run with id 999999" in unknown.output
