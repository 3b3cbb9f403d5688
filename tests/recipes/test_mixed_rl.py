"""`make rl-mixed`, CI-sized: one GRPO run over a code_repo and a chat environment, end to end
(recipes/mixed_rl.py).

Real everything: the test database, the `code-repo` image and Docker sandboxes (hidden tests graded
in a fresh one), a Bradley–Terry reward model trained here and served by `crucible rm serve`, vLLM on
CPU, a task worker on the `code_repo` and `chat` queues and the controller as child processes, a GRPO
trainer process that must publish steps made of both environments' groups. Only the sizes shrink.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Environment, Episode, EpisodeGroup, Run, TrainingStep
from recipes.mixed_rl import CHAT_ENV, CODE_ENV, MixedRLSettings, chat_spec, run_mixed_rl, tasks


@pytest.mark.parametrize(("options", "given"), [
    ({"train_tasks": 0}, "got 0, 100.0"),
    ({"chat_scale": -1.0}, "-1.0"),
    ({"rm_pairs": 3}, ", 3 and"),
])
def test_settings_name_what_they_expected(options: dict, given: str) -> None:
    with pytest.raises(ValueError, match="expected") as error:
        MixedRLSettings(**options)
    assert given in str(error.value)


def test_tasks_are_seeded_and_chat_asks_for_what_the_reward_model_knows() -> None:
    settings = MixedRLSettings(train_tasks=12, seed=3)
    first, again = tasks(settings), tasks(settings)
    assert first == again and {len(items) for items in first.values()} == {12}
    assert all(1 <= task.number <= 9 and str(task.number) in task.instruction for task in first[CHAT_ENV])
    assert all(10 <= task.number <= 99 for task in first[CODE_ENV])
    spec = chat_spec(settings, reward_model_url="http://127.0.0.1:9/v1")
    assert spec["verifier"]["weights"] == {"reward_model": settings.chat_scale}  # chat pays 0–10, code 0–1


@pytest.mark.docker
@pytest.mark.slow  # ~10 min on 2 cores: `make test-all` runs it
@pytest.mark.timeout(2400)
def test_a_run_mixing_code_and_chat_trains_with_both_normalised_per_environment(
    tmp_path: Path, db_session: Session
) -> None:
    settings = MixedRLSettings(rl_minutes=25, rl_steps=3, train_tasks=8, workdir=tmp_path, vllm_startup_s=900)
    out = io.StringIO()
    result = run_mixed_rl(settings, console=Console(file=out, width=200))
    log = out.getvalue()[-3000:]

    assert json.loads((tmp_path / "result.json").read_text()) == result
    run = db_session.get(Run, result["run_id"])
    assert run is not None and run.purpose == "train"
    assert db_session.scalar(select(func.count()).where(TrainingStep.run_id == run.id)) >= 3, log
    # The trainer consumed groups of both environments, and trained episodes of both.
    consumed = dict(db_session.execute(
        select(Environment.name, func.count()).join(EpisodeGroup, EpisodeGroup.environment_id == Environment.id)
        .where(EpisodeGroup.run_id == run.id, EpisodeGroup.consumed_step.is_not(None))
        .group_by(Environment.name)).all())
    assert set(consumed) == {CODE_ENV, CHAT_ENV}, (consumed, log)
    trained = dict(db_session.execute(
        select(Environment.name, func.count()).join(Episode, Episode.environment_id == Environment.id)
        .where(Episode.run_id == run.id, Episode.advantage.is_not(None)).group_by(Environment.name)).all())
    assert set(trained) == {CODE_ENV, CHAT_ENV}
    # The chat episodes were scored by the reward model (a layer with R in its record), the code ones by
    # the hidden tests, each on its own scale.
    layers = {name: comps for name, comps in db_session.execute(
        select(Environment.name, Episode.reward_components).join(Environment, Episode.environment_id == Environment.id)
        .where(Episode.run_id == run.id, Episode.status == "completed"))}
    assert "reward_model" in layers[CHAT_ENV] and "hidden_tests" in layers[CODE_ENV]

    # Per-environment normalisation is in the step metrics: in every step that trained an environment
    # with spread, its normalised scores have std 1 whatever its raw spread.
    both = [point for point in result["steps"]
            if all(point[env][f"score/{env}/std"] is not None for env in (CODE_ENV, CHAT_ENV))]
    for point in result["steps"]:
        for env in (CODE_ENV, CHAT_ENV):
            std = point[env][f"score/{env}/std"]
            assert std is None or std == pytest.approx(1.0, abs=1e-3) or std == 0.0, point
    assert both, result["steps"]
    # Raw, chat (0–100) spreads far wider than code (0–1); normalised, the two are alike.
    assert any(point[CHAT_ENV][f"reward/{CHAT_ENV}/std"] > 5 * point[CODE_ENV][f"reward/{CODE_ENV}/std"]
               for point in both), both
    assert result["consumed_groups"] == {"code_repo": consumed[CODE_ENV], "chat": consumed[CHAT_ENV]}
    assert "score std (normalised)" in out.getvalue()
