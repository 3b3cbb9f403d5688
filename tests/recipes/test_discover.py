"""The beyond-demonstrations recipe (recipes/discover.py): its warm-up never shows the strategy RL has to find.

The claim the recipe makes is about its data, so the data is checked: every demonstration names the
file it reads in its instruction, none reads a file because a listing singled it out, and no
demonstration has an instruction of the trained family. The end-to-end run (real vLLM, worker,
trainer) is the demo's pipeline (tests/recipes/test_demo.py runs it in `make test`); this recipe's own
end-to-end run is slow and runs with `make test-all`.
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
from recipes.discover import NAMES, SETTINGS, demonstrations, run_discover, tasks


def _cat_target(turns: list) -> str:
    [path] = [call["arguments"]["command"].removeprefix("cat ") for call, _ in turns
              if call["name"] == "bash" and call["arguments"]["command"].startswith("cat ")]
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_demonstration_reads_the_file_its_instruction_names(seed: int) -> None:
    settings = dataclasses.replace(SETTINGS, seed=seed)
    demos = demonstrations(settings, count=5 * settings.train_tasks)
    looked = 0
    for demo in demos:
        path = _cat_target(demo.turns)
        assert demo.instruction != UNNAMED
        assert re.search(rf"\bThe file {re.escape(path)} holds a number\b", demo.instruction), demo
        if demo.turns[0][0]["arguments"].get("command") == "ls":
            looked += 1
            listed = demo.turns[0][1].split()
            # The listing never singles the file out: it shows two or three, the instruction decides.
            assert len(listed) >= 2 and path in listed, demo
            assert listed == sorted(listed) == list(demo.listing)
        # Every demonstration submits what the file it read holds (the observation of the cat).
        [printed] = [o for c, o in demo.turns if c["arguments"].get("command", "").startswith("cat ")]
        assert demo.turns[-1] == ({"name": "submit", "arguments": {"answer": printed.strip()}}, None)
    # Looking first is the convention: every demonstration lists the workspace before it reads.
    assert looked == len(demos)


def test_the_trained_and_held_out_tasks_name_no_file() -> None:
    train, test = tasks(SETTINGS)
    assert {t.instruction for t in train + test} == {UNNAMED}
    assert all(t.payload.path in NAMES for t in train + test)
    # No fixed guess does better than a fifth: the files spread evenly over the names.
    for split in (train, test):
        counts = [sum(t.payload.path == name for t in split) for name in NAMES]
        assert max(counts) - min(counts) <= 1, counts  # every name equally often: no guess beats a fifth
    assert not {t.payload.number for t in train} & {t.payload.number for t in test}
    # The demonstrations' instructions are none of the trained tasks' (none is UNNAMED).
    assert not {d.instruction for d in demonstrations(SETTINGS, count=300)} & {t.instruction for t in train + test}


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
        assert sum(result[f"first_action_{when}"].values()) == len(episodes)
