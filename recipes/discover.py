"""`make rl-discover`: RL asked to learn what no demonstration showed (it does not yet: the variants
tried and what each measured are in docs/training/learning.md#discover).

    make rl-discover                                  # = .venv/bin/python -m recipes.discover
    .venv/bin/python -m recipes.discover --rl-minutes 8 --seed 1

The task family (`find-number`, the read_number kind): a file in the workspace holds a number; the
instruction does not say which file (`environments.read_number.task.UNNAMED`), and its name is one of
`NAMES`, different from task to task. The one way to solve it is to look before reading: `ls`, then
`cat` the file the listing shows, then submit what it holds.

The warm-up teaches the tool-call format and the environment's conventions, never that strategy. Its
demonstrations are episodes of a different family, whose instruction names the file: some read it at
once, some list the workspace first, and there the listing always shows two or three files, so the
file read is the one the instruction named, never one the listing singled out. No demonstration has
an instruction that leaves the file unnamed, and none reads a file because a listing showed it
(`tests/recipes/test_discover.py` checks both on every demonstration). Before RL the model reads a
file it guesses or the listing's file by chance; RL has to discover that the listing tells it which.
Everything after the warm-up is the demo's (recipes/common.learn): held-out evaluation, async GRPO,
held-out evaluation.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from cli.console import console as default_console
from recipes.common import (
    RecipeSettings,
    drop_reasons,
    learn,
    prepare,
    register,
    render_episode,
    says_what_stays_running,
    settled,
    sft_in_two_stages,
)

ENV_NAME = "find-number"
NAMES = ("data.txt", "notes.txt", "info.txt", "box.txt", "memo.txt")
"""The file of a task is one of these, each as often as the others (`tasks`), so any fixed guess reads
the right one a fifth of the time: RL starts from the rewards of lucky guesses, and only reading the
listing does better than a fifth. (With ten names the model solved 2 % before RL, nearly every group
had no reward to learn from, and 8 minutes of RL moved nothing.)"""
ENV_SPEC: dict[str, Any] = {
    "name": ENV_NAME, "kind": "read_number", "image": "code-repo",
    "description": "A file in the workspace holds a number; find it (no file is named) and submit it.",
    "sandbox": {"memory": "256m", "pids": 64, "workspace_size": "16m", "tmp_size": "16m", "max_lifetime_s": 3600},
    "limits": {"max_turns": 4, "max_context_tokens": 1024, "max_response_tokens": 48, "episode_timeout_s": 60,
               "tool_timeout_s": 5, "max_tool_errors": 2},
    "verifier": {"weights": {"answer": 1.0}},
}
SETTINGS = RecipeSettings(sloppy_steps=0, rl_minutes=8.0)
"""The demo's sizes, one warm-up stage (there is no sloppy expert), and a longer RL phase. Not yet
enough: see docs/training/learning.md#discover for what each variant measured."""


def tasks(settings: RecipeSettings) -> tuple[list[Any], list[Any]]:
    """The train and held-out tasks: unnamed files, numbers disjoint between the splits, and within each
    split every name holds the number equally often (a name more frequent than the others would pay a
    fixed guess, and RL found that guess: 12 % → 17 % held out, while it learnt to skip the listing)."""
    from environments.read_number.task import make_splits

    train, test = make_splits(train=settings.train_tasks, test=settings.test_tasks, seed=settings.seed,
                              digits=settings.digits, file_names=NAMES, named=False)
    return _balanced(train, seed=settings.seed), _balanced(test, seed=settings.seed + 1)


def _balanced(split: list[Any], *, seed: int) -> list[Any]:
    order = list(range(len(split)))
    random.Random(f"discover-names:{seed}").shuffle(order)
    names = {index: NAMES[rank % len(NAMES)] for rank, index in enumerate(order)}
    return [dataclasses.replace(task, payload=task.payload.model_copy(update={"path": names[index]}))
            for index, task in enumerate(split)]


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """One warm-up episode: the instruction, the files the workspace lists, the calls and what each printed."""

    instruction: str
    listing: tuple[str, ...]
    turns: list[tuple[dict[str, Any], str | None]]


def demonstrations(settings: RecipeSettings, *, count: int, look_fraction: float = 1.0) -> list[Demonstration]:
    """`count` episodes of the named family over the train tasks' numbers: the instruction names the
    file; a `look_fraction` of them (all, by default: looking first is the convention) list the
    workspace first (the file and one or two others), then read the named file; every one submits
    what the file holds. (With half of them looking first, the model mostly guessed a name at once,
    and 8 minutes of RL never found the listing: 14 % → 21 % held out, seed 0.)"""
    from environments.read_number.task import ReadNumberTask, instruction_for

    rng = random.Random(f"discover-demos:{settings.seed}")
    train, _ = tasks(settings)
    demos = []
    for index in range(count):
        number = train[index % len(train)].payload.number
        path = rng.choice(NAMES)
        others = rng.sample([name for name in NAMES if name != path], rng.randint(1, 2))
        listing = tuple(sorted([path, *others]))
        turns: list[tuple[dict[str, Any], str | None]] = []
        if rng.random() < look_fraction:
            turns.append(({"name": "bash", "arguments": {"command": "ls"}}, "".join(f"{n}\n" for n in listing)))
        turns.append(({"name": "bash", "arguments": {"command": f"cat {path}"}}, f"{number}\n"))
        turns.append(({"name": "submit", "arguments": {"answer": number}}, None))
        demos.append(Demonstration(instruction=instruction_for(ReadNumberTask(path=path, number=number)),
                                   listing=listing, turns=turns))
    return demos


def warm_up(settings: RecipeSettings, *, workdir: Path, console: Console) -> Path:
    """One SFT stage on the named family's demonstrations (`demonstrations`)."""
    from environments.read_number.kind import SYSTEM_PROMPT, TOOL_SCHEMAS

    rng = random.Random(settings.seed)

    def rendered(sloppy: bool) -> list[tuple[list[int], list[int]]]:
        assert not sloppy, "this recipe has no sloppy stage"
        return [render_episode(tokenizer_dir=workdir / "tiny", system_prompt=SYSTEM_PROMPT,
                               tools=list(TOOL_SCHEMAS.values()), opening=demo.instruction, turns=demo.turns,
                               short=rng.random() < settings.short_fraction)
                for demo in demonstrations(settings, count=5 * settings.train_tasks)]

    return sft_in_two_stages(
        settings, workdir=workdir, console=console, batch_size=16, demonstrations=rendered,
        what=f"{settings.sft_steps} SFT steps on episodes whose instruction names the file (the tool format, "
             f"`ls`, `cat`, `submit`; never a file left unnamed)")


def strategies(run_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per run, how its episodes began: `ls` first, `cat` first, or anything else (a submit at once, an
    other command): what RL changed, read off the stored actions."""
    from sqlalchemy import select

    from core.db import session_scope
    from core.models import Turn

    out: dict[int, dict[str, int]] = {}
    with session_scope() as session:
        for run_id in run_ids:
            counts = {"ls_first": 0, "cat_first": 0, "other": 0}
            calls = session.execute(select(Turn.tool_call).where(Turn.run_id == run_id, Turn.index == 0)).scalars()
            for call in calls:
                command = ((call or {}).get("arguments") or {}).get("command")
                command = command.strip() if isinstance(command, str) else ""
                key = "ls_first" if command.startswith("ls") else "cat_first" if command.startswith("cat") else "other"
                counts[key] += 1
            out[run_id] = counts
    return out


@says_what_stays_running
def run_discover(settings: RecipeSettings, *, console: Console) -> dict[str, Any]:
    """Every stage with these settings; returns what it writes to result.json."""
    settings = settled(settings, name="discover")
    began = time.monotonic()
    path = prepare(settings, console=console)
    warm = warm_up(settings, workdir=path, console=console)
    counts = register(ENV_SPEC, tasks(settings))
    console.print(f"  tasks: {counts['train']} train, {counts['test']} held-out ({ENV_NAME}, no file named)")
    learned = learn(settings, path=path, warm=warm, environment=ENV_NAME, prefix="discover", console=console)
    dropped = drop_reasons(learned.run_id)
    opened = strategies([learned.before.run_id, learned.after.run_id])
    result = {**learned.figures(), "first_action_before": opened[learned.before.run_id],
              "first_action_after": opened[learned.after.run_id],
              "minutes": round((time.monotonic() - began) / 60, 1), "dropped_groups": dropped, "curve": learned.curve}
    (path / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    before, after = learned.before, learned.after
    console.print(f"  held-out episodes' first action, before → after: {result['first_action_before']} → "
                  f"{result['first_action_after']}")
    console.print(f"\n[bold]held-out success: {before.success:.0%} [{before.low:.0%}–{before.high:.0%}] → "
                  f"{after.success:.0%} [{after.low:.0%}–{after.high:.0%}] ({result['delta_points']:+.1f} points)[/] "
                  f"in {result['minutes']} min. Run {learned.run_id} stays in the store; curve and numbers in "
                  f"{path / 'result.json'}")
    return result


def main(
    rl_minutes: float = typer.Option(SETTINGS.rl_minutes, help="Wall-clock budget of the RL phase."),
    sft_steps: int = typer.Option(SETTINGS.sft_steps, help="Warm-up optimizer steps."),
    seed: int = typer.Option(0, help="Seed of the model, the tasks and the run."),
    workdir: Path | None = typer.Option(None, help="Default: <data dir>/discover/<timestamp>."),
) -> None:
    """RL discovers a strategy no demonstration showed: list the workspace, read the file it shows."""
    settings = dataclasses.replace(SETTINGS, rl_minutes=rl_minutes, sft_steps=sft_steps, seed=seed, workdir=workdir)
    run_discover(settings, console=default_console)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(main)
