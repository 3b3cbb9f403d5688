"""`make demo`, CI-sized: the same pipeline end to end with a tiny budget, inside `make test`.

Real everything: the test database, the code-repo sandbox image and Docker sandboxes, vLLM on CPU
serving the warmed-up tiny model, a task worker and the controller as child processes, a real GRPO
trainer process that must publish at least one step. Only the sizes shrink (SFT steps, tasks, groups)
and the RL phase ends after its first trainer step instead of after minutes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Episode, Run, TrainingStep
from recipes.common import RecipeSettings
from recipes.demo import run_demo

# Kept in `make test`: the README's demo must keep working. Its worker's reaper sweeps the machine's
# containers: on the xdist worker of the other tests that do (group "docker-global").
pytestmark = [pytest.mark.docker, pytest.mark.vllm, pytest.mark.xdist_group("docker-global")]


@pytest.mark.timeout(2400)
def test_the_demo_pipeline_runs_end_to_end(tmp_path: Path, db_session: Session) -> None:
    # 200 SFT steps: with far fewer the model has not learnt the tool format, every episode is a
    # format_error, every group has zero variance and is dropped, and no trainer step ever comes.
    settings = RecipeSettings(
        rl_minutes=15, rl_steps=1, sft_steps=200, sloppy_steps=10, train_tasks=8, test_tasks=4, group_size=4,
        batch_size=2, eval_samples=1, workdir=tmp_path, vllm_startup_s=900,
    )
    out = io.StringIO()
    result = run_demo(settings, console=Console(file=out, width=200))
    print(out.getvalue())  # each stage and its seconds (`pytest -s` or `-rP` shows it)

    assert json.loads((tmp_path / "result.json").read_text()) == result
    # The two figures are those of the two stored held-out eval runs, each over every test task: a
    # figure computed from anything else (the train run, a partial eval, a constant) fails here.
    evals = db_session.execute(select(Run).where(Run.purpose == "eval").order_by(Run.id)).scalars().all()
    assert [r.config["split"] for r in evals] == ["test", "test"]
    for run, figure in zip(evals, (result["held_out_success_before"], result["held_out_success_after"]), strict=True):
        rewards = db_session.execute(select(Episode.reward).where(Episode.run_id == run.id,
                                                                 Episode.status == "completed")).scalars().all()
        assert len(rewards) == settings.test_tasks * settings.eval_samples, (run.id, rewards)
        assert figure == sum(reward >= 1.0 for reward in rewards) / len(rewards), (run.id, figure, rewards)
    assert result["eval_run_ids"] == [r.id for r in evals]
    for when in ("before", "after"):  # each figure inside its interval (`crucible eval`'s report, tasks resampled)
        low, high = result[f"held_out_interval_{when}"]
        assert low - 1e-4 <= result[f"held_out_success_{when}"] <= high + 1e-4, result
    assert result["delta_points"] == round(100 * (result["held_out_success_after"] - result["held_out_success_before"]), 1)
    assert [point["step"] for point in result["curve"]][:1] == [1], out.getvalue()[-3000:]

    run = db_session.get(Run, result["run_id"])
    assert run is not None and run.purpose == "train"
    steps = db_session.scalar(select(func.count()).where(TrainingStep.run_id == run.id))
    assert steps >= 1
    # Every episode the demo's runs produced was played and graded (none left half-done).
    statuses = dict(db_session.execute(select(Episode.status, func.count()).group_by(Episode.status)).all())
    assert statuses.get("completed", 0) >= settings.test_tasks * settings.eval_samples * 2
    assert "held-out success" in out.getvalue()
