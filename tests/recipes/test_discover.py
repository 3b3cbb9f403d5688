"""The beyond-demonstrations recipe (recipes/discover.py): its warm-up never shows the strategy RL has to find.

The claim the recipe makes is about its data, so the data is checked: every demonstration lists the
workspace, reads one file and submits what that printed; a named one reads the file its instruction
names, from a listing of two or three; a blind one (the trained family's instruction, a listing of the
one file) reads a name drawn whatever the listing shows, so it reads the listed file about a fifth of
the time, as any guess would. The end-to-end run (real vLLM, worker, trainer) is the demo's pipeline
(tests/recipes/test_demo.py runs it in `make test`); this recipe's own end-to-end run is slow and runs
with `make test-all`. tests/environments/read_number/test_read_number.py checks the blind episodes' observations
against a real sandbox's.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode, Run
from environments.read_number.task import UNNAMED
from recipes.discover import NAMES, SETTINGS, demonstrations, missing, run_discover, tasks


def _cat_target(turns: list) -> str:
    [path] = [call["arguments"]["command"].removeprefix("cat ") for call, _ in turns
              if call["name"] == "bash" and call["arguments"]["command"].startswith("cat ")]
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_demonstration_chooses_its_file_by_the_listing(seed: int) -> None:
    settings = dataclasses.replace(SETTINGS, seed=seed)
    demos = demonstrations(settings, count=5 * settings.train_tasks)
    blind = [demo for demo in demos if demo.blind]
    numbers = {task.payload.number for task in tasks(settings)[0]}
    assert 0.35 * len(demos) < len(blind) < 0.65 * len(demos)  # blind_fraction 0.5
    for demo in demos:
        ls, _cat, submit = (call for call, _ in demo.turns)
        # Looking first is the convention: every demonstration lists the workspace before it reads.
        assert ls == {"name": "bash", "arguments": {"command": "ls"}}
        listed = demo.turns[0][1].split()
        assert listed == sorted(listed) == list(demo.listing)
        path = _cat_target(demo.turns)
        printed = demo.turns[1][1]
        if demo.blind:
            assert demo.instruction == UNNAMED and len(listed) == 1 and path in NAMES
            # The environment's truth: the listed file holds a train task's number, any other name is absent.
            assert printed == missing(path) if path != listed[0] else printed.strip() in numbers
            assert submit == {"name": "submit", "arguments": {"answer": printed.strip() if path == listed[0] else "0"}}
        else:
            assert re.search(rf"\bThe file {re.escape(path)} holds a number\b", demo.instruction), demo
            # The listing never singles the file out: it shows two or three, the instruction decides.
            assert len(listed) >= 2 and path in listed, demo
            assert submit == {"name": "submit", "arguments": {"answer": printed.strip()}}
        assert printed.strip().isdigit() == (path in listed)
    # A blind demonstration reads the listed file as often as a guess does, no more, whatever the
    # listing: per listed file, each name is read equally often (the fifth of a cycle left over aside).
    for listed_name in NAMES:
        reads = [_cat_target(demo.turns) for demo in blind if demo.listing == (listed_name,)]
        counts = [reads.count(name) for name in NAMES]
        assert len(reads) >= 10 and max(counts) - min(counts) <= 1, (listed_name, counts)


def test_the_trained_and_held_out_tasks_name_no_file() -> None:
    train, test = tasks(SETTINGS)
    assert {t.instruction for t in train + test} == {UNNAMED}
    assert all(t.payload.path in NAMES for t in train + test)
    # No fixed guess does better than a fifth: the files spread evenly over the names.
    for split in (train, test):
        counts = [sum(t.payload.path == name for t in split) for name in NAMES]
        assert max(counts) - min(counts) <= 1, counts  # every name equally often: no guess beats a fifth
    assert not {t.payload.number for t in train} & {t.payload.number for t in test}
    # The demonstrations' numbers are the train split's: a held-out number was never read in the warm-up.
    assert not {d.turns[-1][0]["arguments"]["answer"] for d in demonstrations(SETTINGS, count=300)} & \
        {t.payload.number for t in test}


def _store(session: Session, run_id: int, calls: list[tuple[str | None, str | None]]) -> None:
    """One stored episode of run `run_id` whose turns ran these (command or None: no parsed call, observation)."""
    from core.models import Turn
    from tests import factories

    the_run = session.get(Run, run_id) or factories.run(session, id=run_id)
    episode = factories.episode(session, factories.group(session, run=the_run), status="completed")
    for index, (command, observation) in enumerate(calls):
        session.add(Turn(run_id=run_id, episode_id=episode.id, index=index, token_ids=[1, 2], logprobs=[0.0, -0.1],
                         loss_mask=[0, 1], prompt_length=1, completion_text="x", observation=observation,
                         tool_call={"name": "bash", "arguments": {"command": command}} if command else None,
                         weight_version=0, finish_reason="stop"))
    session.commit()


def test_strategies_counts_what_the_stored_episodes_did(db_session: Session) -> None:
    from recipes.discover import strategies

    _store(db_session, 7, [("ls", "memo.txt\n"), ("cat memo.txt", "41\n")])  # looked, read the listed file
    _store(db_session, 7, [("ls", "memo.txt\n"), ("cat box.txt", missing("box.txt")), ("cat memo.txt", "41\n")])
    _store(db_session, 7, [("cat memo.txt", "41\n")])  # read at once: nothing was listed
    _store(db_session, 7, [(None, None), ("ls", None)])  # a malformed first turn; a listing that printed nothing
    _store(db_session, 8, [("ls -a", "data.txt\n"), ("cat  data.txt ", "12\n")])
    assert strategies([7, 8, 9]) == {
        7: {"ls_first": 2, "cat_first": 1, "other": 1, "reads_listed": 1},  # only the first cat counts
        8: {"ls_first": 1, "cat_first": 0, "other": 0, "reads_listed": 1},
        9: {"ls_first": 0, "cat_first": 0, "other": 0, "reads_listed": 0},
    }


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.vllm
@pytest.mark.xdist_group("docker-global")
@pytest.mark.timeout(2400)
def test_the_discover_recipe_runs_end_to_end(tmp_path: Path, db_session: Session) -> None:
    settings = dataclasses.replace(SETTINGS, rl_minutes=15, rl_steps=1, sft_steps=200, train_tasks=8, test_tasks=4,
                                   group_size=4, batch_size=2, eval_samples=1, workdir=tmp_path, vllm_startup_s=900)
    out = io.StringIO()
    result = run_discover(settings, console=Console(file=out, width=200))
    print(out.getvalue())
    assert json.loads((tmp_path / "result.json").read_text()) == result
    evals = db_session.execute(select(Run).where(Run.purpose == "eval").order_by(Run.id)).scalars().all()
    assert result["eval_run_ids"] == [r.id for r in evals]
    for run, when in zip(evals, ("before", "after"), strict=True):
        episodes = db_session.execute(select(Episode).where(Episode.run_id == run.id)).scalars().all()
        assert len(episodes) == settings.test_tasks * settings.eval_samples
        opened = result[f"first_action_{when}"]
        assert opened["ls_first"] + opened["cat_first"] + opened["other"] == len(episodes)
        assert 0 <= opened["reads_listed"] <= len(episodes)
