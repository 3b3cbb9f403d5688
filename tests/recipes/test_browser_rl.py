"""`make rl-browser`, CI-sized: real RL on browser episodes end to end (recipes/browser_rl.py).

Real everything: the test database, the `browser` image and Docker sandboxes with Chromium, the
scripted MiniWoB++ solver playing real pages for the warm-up's demonstrations, vLLM on CPU, a task
worker on the `browser` queue and the controller as child processes, a GRPO trainer process that
must publish two steps made of browser episodes. Only the sizes shrink.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Environment, Episode, EpisodeGroup, Run, Task, TrainingStep
from recipes.browser_rl import (
    ENV_NAME,
    RETIRED,
    TASKS,
    BrowserRLSettings,
    _wrong_call,
    register,
    run_browser_rl,
    task_seeds,
)

OPENING = """# Goal
Click button ONE.

# Page
URL: http://e1.crucible.internal:1/miniwob/click-test-2.html

RootWebArea 'Click Test Task', focused
  [9] generic '', clickable
    [11] generic 'Click button ONE.'
    [13] button 'ONE'
    [14] button 'TWO'"""


def click(bid: str) -> dict:
    return {"name": "click", "arguments": {"bid": bid}}


def test_the_sloppy_players_mistake_is_another_element_of_the_same_role() -> None:
    picks = {_wrong_call(OPENING, click("13"), random.Random(seed))["arguments"]["bid"] for seed in range(50)}
    assert picks == {"14"}  # the other button, never the right one nor a text
    only = "# Page\n\nRootWebArea 'x'\n  [9] generic ''\n    [13] button 'Click Me!'"
    assert {_wrong_call(only, click("13"), random.Random(seed))["arguments"]["bid"] for seed in range(50)} == {"9"}
    assert _wrong_call("# Page\n\n  [13] button 'Click Me!'", click("13"), random.Random(0)) is None


@pytest.mark.parametrize(("options", "message"), [
    ({"tasks": ("enter-text",)}, "clicks alone"),  # solved with fill: the environment offers click and noop
    ({"tasks": ("click-test", "no-such-page")}, "no-such-page"),
    ({"tasks": ()}, "got []"),
    ({"train_seeds": 0}, "got 0 and"),
    ({"test_seeds": -3}, "got 10 and -3"),
    ({"held_out_pages": ("click-test",)}, "got ['click-test'] (also in tasks)"),  # a trained page is not new
    ({"held_out_pages": ("enter-password",)}, "held_out_pages: expected"),
    ({"held_out_pages": ("../../etc",)}, "../../etc"),
])
def test_settings_name_what_they_expected(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match="expected") as error:
        BrowserRLSettings(**options)
    assert message in str(error.value)


def test_task_counts_follow_from_pages_and_seeds() -> None:
    settings = BrowserRLSettings(tasks=("click-test", "focus-text"), train_seeds=3, test_seeds=2, held_out_pages=())
    assert (settings.train_tasks, settings.test_tasks) == (6, 4)
    settings = BrowserRLSettings(tasks=("click-test", "focus-text"), train_seeds=3, test_seeds=2)
    assert settings.held_out_pages == ("click-link",) and (settings.train_tasks, settings.test_tasks) == (6, 6)


def test_a_held_out_page_is_in_no_train_task_and_at_no_train_seed() -> None:
    seeds = task_seeds(BrowserRLSettings())
    train, test = set(seeds["train"]), set(seeds["test"])
    assert not train & test
    assert {name for name, _ in train} == set(TASKS) and {name for name, _ in test} == {*TASKS, "click-link"}
    assert max(seed for _, seed in train) < min(seed for _, seed in test)


def test_a_second_task_set_retires_the_first_ones_leftovers(db_session: Session) -> None:
    register(BrowserRLSettings(tasks=("click-test", "focus-text"), train_seeds=2, test_seeds=1))
    register(BrowserRLSettings(tasks=("click-test",), train_seeds=1, test_seeds=1, held_out_pages=()))
    splits = dict(db_session.execute(select(Task.external_id, Task.split)
                                     .where(Task.environment_name == ENV_NAME)).all())
    assert splits == {"miniwob/click-test/0": "train", "miniwob/click-test/100000": "test",
                      "miniwob/click-test/1": RETIRED, "miniwob/focus-text/0": RETIRED,
                      "miniwob/focus-text/1": RETIRED, "miniwob/focus-text/100000": RETIRED,
                      "miniwob/click-link/100000": RETIRED}


@pytest.mark.docker
@pytest.mark.slow  # ~8 min on 2 cores: `make test-all` runs it
@pytest.mark.timeout(2400)
def test_rl_trains_on_browser_episodes_end_to_end(tmp_path: Path, db_session: Session) -> None:
    # 150 SFT steps: with fewer most completions are malformed, every group has zero variance and is
    # dropped, and no trainer step comes.
    settings = BrowserRLSettings(
        rl_minutes=20, rl_steps=2, sft_steps=150, sloppy_steps=5, train_seeds=2, test_seeds=1, group_size=4,
        batch_size=2, eval_samples=1, workdir=tmp_path, vllm_startup_s=900,
    )
    out = io.StringIO()
    result = run_browser_rl(settings, console=Console(file=out, width=200))

    assert json.loads((tmp_path / "result.json").read_text()) == result
    assert [point["step"] for point in result["curve"]] == [1, 2], out.getvalue()[-3000:]
    # The figures are the store's, recounted here from the episodes (a figure made up, or read from the
    # wrong run or step, differs): pass@1 over held-out tasks, and each step's share of solved episodes.
    for key, eval_run in (("held_out_success_before", result["eval_run_ids"][0]),
                          ("held_out_success_after", result["eval_run_ids"][-1])):
        assert result[key] == pytest.approx(_pass_at_1(db_session, eval_run), abs=1e-9), key
    for point in result["curve"]:
        assert point["success"] == pytest.approx(_step_success(db_session, result["run_id"], point["step"]),
                                                 abs=1e-6), point  # the metric is rounded to 6 places

    run = db_session.get(Run, result["run_id"])
    assert run is not None and run.purpose == "train"
    assert db_session.scalar(select(func.count()).where(TrainingStep.run_id == run.id)) >= 2
    # The trainer's steps were made of browser episodes: groups of the browser environment, consumed.
    consumed = db_session.execute(
        select(Environment.kind, Environment.name, func.count()).join(EpisodeGroup, EpisodeGroup.environment_id ==
                                                                       Environment.id)
        .where(EpisodeGroup.run_id == run.id, EpisodeGroup.consumed_step.is_not(None))
        .group_by(Environment.kind, Environment.name)).all()
    assert [(kind, name) for kind, name, _ in consumed] == [("browser", ENV_NAME)]
    assert consumed[0][2] >= 2 and result["consumed_groups"] == {"browser": consumed[0][2]}
    trained = db_session.scalar(select(func.count()).where(Episode.run_id == run.id, Episode.advantage.is_not(None)))
    assert trained >= 2 * settings.group_size
    # Both held-out evaluations played every held-out task, every episode through the browser.
    assert result["episodes"]["browser"] >= 2 * settings.test_tasks + trained
    # The demonstrations are framed exactly as the loop stores an episode (prompt, observations, masks),
    # and the warm-up taught the model the demonstrations' very action tokens.
    rendering = result["rendering"]
    assert rendering["compared"] >= 1 and rendering["matched"] == rendering["compared"], rendering
    assert rendering["canonical"] >= 1, rendering
    assert "held-out success" in out.getvalue()
    # The held-out page was evaluated, before and after, and never trained on.
    assert set(result["held_out_by_page"]) == {*settings.tasks, *settings.held_out_pages}
    for cell in result["held_out_by_page"]["click-link"].values():
        assert cell["tasks"] == settings.test_seeds and 0.0 <= cell["success"] <= 1.0
    trained_pages = db_session.execute(select(Task.payload["name"].astext).join(Episode, Episode.task_id == Task.id)
                                       .where(Episode.run_id == run.id).distinct()).scalars().all()
    assert "click-link" not in trained_pages and trained_pages


@pytest.mark.parametrize(("pages", "message"), [
    ("click-test", "also in tasks"),
    ("click-link,../../etc/passwd", "../../etc/passwd"),
])
def test_the_command_line_refuses_a_held_out_page_in_one_line(pages: str, message: str) -> None:
    import typer
    from typer.testing import CliRunner

    from recipes.browser_rl import main

    app = typer.Typer()
    app.command()(main)
    result = CliRunner().invoke(app, ["--held-out-pages", pages])
    assert result.exit_code == 2 and message in result.output and "held_out_pages: expected" in result.output


def test_by_page_counts_what_crucible_eval_counts(db_session: Session) -> None:
    from recipes.browser_rl import by_page
    from tests import factories

    env = factories.environment(db_session)
    the_run = factories.run(db_session, group_size=2)
    outcomes = {"click-link": [(1.0, "completed"), (0.0, "completed")],  # one task: half solved
                "click-test": [(1.0, "completed"), (1.0, "failed")]}  # a machine's fault is excluded, not a miss
    for page, episodes in outcomes.items():
        the_task = factories.task(db_session, env, payload={"family": "miniwob", "name": page, "seed": 100_000})
        the_group = factories.group(db_session, env=env, task=the_task, run=the_run)
        for index, (reward, status) in enumerate(episodes):
            factories.episode(db_session, the_group, sample_index=index, reward=reward, status=status)
    db_session.commit()
    assert by_page(the_run.id) == {
        "click-link": {"tasks": 1, "success": 0.5, "interval": [0.5, 0.5]},
        "click-test": {"tasks": 1, "success": 1.0, "interval": [1.0, 1.0]},
    }


def _pass_at_1(session: Session, run_id: int) -> float:
    """The mean over tasks of the share of a task's completed episodes solved (reward ≥ SOLVED_AT)."""
    from collections import defaultdict

    from environments.rewards import SOLVED_AT

    by_task: dict[int, list[bool]] = defaultdict(list)
    for task_id, reward in session.execute(select(Episode.task_id, Episode.reward)
                                           .where(Episode.run_id == run_id, Episode.status == "completed")):
        by_task[task_id].append(reward is not None and reward >= SOLVED_AT)
    assert by_task, f"eval run {run_id} has no completed episode"
    return sum(sum(solved) / len(solved) for solved in by_task.values()) / len(by_task)


def _step_success(session: Session, run_id: int, step: int) -> float:
    """The share of solved episodes among those the step scored (trainer.metrics' `reward/success_frac`):
    the trained episodes of the groups it consumed, and the completed episodes of the groups dropped while
    it waited for a batch (every group dropped then carries the trainer's version before the step) for
    having nothing to compare (zero variance, one sample left): leaving solved groups out would bias it low."""
    from core.termination import DropReason
    from environments.rewards import SOLVED_AT

    trained = (EpisodeGroup.consumed_step == step) & Episode.advantage.is_not(None)
    compared = ((EpisodeGroup.dropped_step == step - 1) & (Episode.status == "completed")
                & EpisodeGroup.drop_reason.in_([DropReason.ZERO_VARIANCE, DropReason.TOO_FEW_SAMPLES]))
    rewards = session.execute(select(Episode.reward).join(EpisodeGroup, Episode.group_id == EpisodeGroup.id)
                              .where(EpisodeGroup.run_id == run_id, trained | compared)).scalars().all()
    assert rewards, f"step {step} of run {run_id} scored no episode"
    return sum(reward >= SOLVED_AT for reward in rewards) / len(rewards)
