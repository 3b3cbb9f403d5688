"""`crucible run cost RUN`, run as a user runs it (a subprocess on the test database), after real
trainer steps (tests/trainer/cost_steps.py): the per-step cost the steps recorded, totals by stage,
and the GPU-hours projection, each checked against what the test reads from the database itself."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from core.models import TrainingStep
from tests.factories import make_run
from tests.trainer.cost_steps import train_steps
from trainer import cost

ROOT = Path(__file__).parents[2]


def _crucible(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}  # the table is wide: keep each row on one line
    return subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def _json(*args: str) -> dict[str, Any]:
    result = _crucible(*args, "-o", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_cost_prints_what_each_step_recorded_and_projects_gpu_hours(
    db_session: Session, tiny_model_dir: Path, tmp_path: Path,
) -> None:
    run_id, rows = train_steps(db_session, model_dir=tiny_model_dir, tmp_path=tmp_path, steps=3)
    view = _json("run", "cost", str(run_id), "--target-steps", "1000", "--gpus", "8")

    assert [s["step"] for s in view["steps"]] == [1, 2, 3] and view["steps_without_cost"] == 0
    for shown, row in zip(view["steps"], rows, strict=True):
        m = row.metrics
        assert shown["stages"]["rollout"] == {"seconds": m[cost.ROLLOUT_S], "work": m[cost.ROLLOUT_TOKENS]}
        assert shown["stages"]["update"] == {"seconds": m[cost.UPDATE_S], "work": m[cost.UPDATE_TOKENS]}
        assert shown["stages"]["reference"] == {"seconds": m[cost.REFERENCE_S], "work": m[cost.REFERENCE_TOKENS]}
        assert shown["stages"]["reward"] == {"seconds": m[cost.REWARD_S], "work": m[cost.REWARD_EPISODES]}
        assert (shown["flops"], shown["flops_per_s"], shown["mfu"]) == (m[cost.FLOPS], m[cost.FLOPS_PER_S], None)
    stage_seconds = {stage: sum(row.metrics[f"cost/{stage}/seconds"] for row in rows) for stage in cost.STAGES}
    for stage, total in view["totals"].items():
        assert total["seconds"] == pytest.approx(stage_seconds[stage])
        assert total["share"] == pytest.approx(stage_seconds[stage] / sum(stage_seconds.values()))
    median_step = statistics.median(row.metrics[cost.STEP_S] for row in rows)
    assert view["projection"]["gpu_hours"] == pytest.approx(1000 * median_step * 8 / 3600)
    assert view["mfu_median"] is None  # CPU

    table = _crucible("run", "cost", str(run_id), "--target-steps", "1000", "--gpus", "8")
    assert table.returncode == 0, table.stderr[-3000:]
    out = table.stdout
    assert f"run {run_id}: cost per step (last 3 of 3)" in out
    assert f"projection: 1000 steps on 8 GPU(s) ≈ {1000 * median_step * 8 / 3600:.2f} GPU-hours" in out
    assert "GPU-hours = target steps × median measured step seconds" in out
    for stage in cost.STAGES:
        assert stage in out
    last = _crucible("run", "cost", str(run_id), "--last", "1")
    assert "(last 1 of 3)" in last.stdout and "projection" not in last.stdout


def test_steps_without_cost_or_with_garbage_in_it_are_counted_not_fatal(db_session: Session) -> None:
    """Steps recorded before cost metrics existed, and a metrics document with a string where a
    number belongs (stored JSON is not trusted): left out or shown as missing, never a crash."""
    run = make_run(db_session, model="/models/none")
    db_session.add_all([
        TrainingStep(run_id=run.id, step=1, policy_version=1, metrics={"loss/policy": 0.1}),
        TrainingStep(run_id=run.id, step=2, policy_version=2,
                     metrics={cost.STEP_S: 2.0, cost.UPDATE_S: "fast", cost.ROLLOUT_S: True, cost.FLOPS: None}),
    ])
    db_session.commit()
    view = _json("run", "cost", str(run.id), "--target-steps", "10")
    assert view["steps_without_cost"] == 1
    [step] = view["steps"]
    assert step["stages"]["update"]["seconds"] is None and step["stages"]["rollout"]["seconds"] is None
    assert view["projection"]["gpu_hours"] == pytest.approx(10 * 2.0 / 3600)
    assert _crucible("run", "cost", str(run.id)).returncode == 0


def test_an_empty_run_says_no_step_has_recorded_its_cost(db_session: Session) -> None:
    run = make_run(db_session, model="/models/none")
    db_session.commit()
    result = _crucible("run", "cost", str(run.id), "--target-steps", "10")
    assert result.returncode == 0
    assert f"run {run.id}: no training step has recorded its cost yet" in result.stdout
    assert _json("run", "cost", str(run.id), "--target-steps", "10")["projection"] is None


def test_an_unknown_run_is_one_line() -> None:
    result = _crucible("run", "cost", "987654")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "987654" in lines[0], result.stderr


@pytest.mark.parametrize(("args", "name"), [
    (["--target-steps", "0"], "--target-steps"), (["--gpus", "-3"], "--gpus"), (["--last", "0"], "--last"),
])
def test_worst_option_values_are_refused_naming_the_option(args: list[str], name: str) -> None:
    result = _crucible("run", "cost", "1", *args)
    assert result.returncode == 2 and name in result.stderr and "greater than or equal to 1" in result.stderr, \
        result.stderr
