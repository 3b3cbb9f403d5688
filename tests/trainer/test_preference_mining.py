"""Pairs mined from stored groups (real Postgres): best vs worst scored episode of each group, the
task's instruction as the prompt, the turns' text as the responses; ties, lone scores, infrastructure
faults, identical texts and other runs' groups teach nothing and are left out. Then `crucible rm train
--run` trains on them as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.episode_text import OBSERVATION_MARK
from core.errors import NotFound
from core.models import Environment, Episode, EpisodeGroup, Run, Task, Turn
from tests import factories
from tests.factories import add_group, make_environment, make_run
from trainer.errors import PreferenceDataError
from trainer.preference_mining import mine_pairs

ROOT = Path(__file__).parents[2]


def _text(session: Session, group: EpisodeGroup, *, same: bool = False) -> None:
    """Give every turn of the group readable text: `ep<sample> turn<index>` (the same for all if `same`)."""
    rows = session.execute(select(Turn, Episode.sample_index).join(Episode, Episode.id == Turn.episode_id)
                           .where(Episode.group_id == group.id)).all()
    for turn, sample in rows:
        turn.completion_text = f"turn{turn.index}" if same else f"ep{sample} turn{turn.index}"
        turn.observation = "exit 0" if turn.index == 0 else None
    session.flush()


def _group(session: Session, *, run: Run, env: Environment, task: Task, rewards: list[float], same: bool = False,
           **kw: Any) -> EpisodeGroup:
    group = add_group(session, run=run, env=env, task=task, rewards=rewards, **kw)
    _text(session, group, same=same)
    return group


def test_each_group_gives_its_best_and_worst_episode_and_the_rest_is_skipped(db_session: Session) -> None:
    run = make_run(db_session, model="tiny")
    other_run = make_run(db_session, model="tiny")
    env, task = make_environment(db_session)
    task2 = factories.task(db_session, env, instruction="Say 7.\x1b[2J")
    _group(db_session, run=run, env=env, task=task, rewards=[0.0, 1.0, 0.5, 1.0])  # best: first of the two 1.0
    _group(db_session, run=run, env=env, task=task, rewards=[1.0, 1.0, 1.0])  # a tie: skipped
    _group(db_session, run=run, env=env, task=task2, rewards=[9.0, 0.2, 0.7], failed=(0,))  # the fault is no score
    _group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], failed=(1,))  # one score left: skipped
    _group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], same=True)  # same text: skipped
    _group(db_session, run=other_run, env=env, task=task, rewards=[0.0, 1.0])
    db_session.commit()

    pairs = mine_pairs(db_session, run_id=run.id)
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [
        ("fix the bug", f"ep1 turn0\n{OBSERVATION_MARK}\nexit 0\nep1 turn1", f"ep0 turn0\n{OBSERVATION_MARK}\nexit 0\nep0 turn1"),
        ("Say 7.\x1b[2J", f"ep2 turn0\n{OBSERVATION_MARK}\nexit 0\nep2 turn1", f"ep1 turn0\n{OBSERVATION_MARK}\nexit 0\nep1 turn1"),
    ]
    assert mine_pairs(db_session, run_id=run.id) == pairs  # the same store, the same pairs


def test_an_unknown_run_or_one_without_two_preferences_is_refused(db_session: Session) -> None:
    with pytest.raises(NotFound, match="--run: expected the id of a run, got -5, which names none"):
        mine_pairs(db_session, run_id=-5)
    run = make_run(db_session, model="tiny")
    env, task = make_environment(db_session)
    _group(db_session, run=run, env=env, task=task, rewards=[0.5, 0.5])
    _group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0])
    db_session.commit()
    with pytest.raises(PreferenceDataError, match=f"--run {run.id}: expected at least 2 groups .*, got 1"):
        mine_pairs(db_session, run_id=run.id)


def test_rm_train_on_a_run_trains_on_its_mined_pairs(db_session: Session, tiny_model_dir: Path, tmp_path: Path) -> None:
    run = make_run(db_session, model="tiny")
    env, task = make_environment(db_session)
    for seed in range(5):
        _group(db_session, run=run, env=env, task=task, rewards=[0.0, 1.0, 0.5], seed=seed)
    db_session.commit()
    env_vars = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "cli.main", "rm", "train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "rm")]
    result = subprocess.run([*base, "--run", str(run.id), "--epochs", "1", "-o", "json"], env=env_vars,
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert (report["train_pairs"], report["held_out_pairs"]) == (4, 1)
    both = subprocess.run([*base, "--run", str(run.id), "--pairs", str(tmp_path / "p.jsonl")], env=env_vars,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert both.returncode == 2
    assert both.stderr.strip().splitlines() == ["error: expected exactly one of --pairs FILE or --run ID, got both"]
