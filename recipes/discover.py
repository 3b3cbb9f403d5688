"""`make rl-discover`: RL asked to learn what no demonstration showed (what each variant measured is in
docs/training/learning.md#discover).

    make rl-discover                                  # = .venv/bin/python -m recipes.discover
    .venv/bin/python -m recipes.discover --rl-minutes 8 --seed 1

The task family (`find-number`, the read_number kind): a file in the workspace holds a number; the
instruction does not say which file (`environments.read_number.task.UNNAMED`), and its name is one of
`NAMES`, different from task to task. The one way to solve it is to look before reading: `ls`, then
`cat` the file the listing shows, then submit what it holds.

The warm-up teaches the tool-call format and the environment's conventions, never that strategy
(`demonstrations`). Every demonstration lists the workspace, reads one file and submits what it
printed. Half of them name the file in the instruction, and there the listing shows two or three
files, so the file read is the one the instruction named. The other half are the trained family's own
episodes played blind: the file read is drawn from `NAMES` whatever the listing shows, right a fifth
of the time. No demonstration's choice of file depends on the listing (`tests/recipes/test_discover.py`
checks every one). Before RL the model guesses; RL has to discover that the listing tells it which
file. Everything after the warm-up is the demo's (recipes/learning.learn): held-out evaluation, async
GRPO, held-out evaluation; `strategies` counts how often the episodes read the listed file, before
and after.
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
    MODEL_HELP,
    RecipeSettings,
    model_option,
    policy_dir,
    prepare,
    register,
    render_episode,
    says_what_stays_running,
    settled,
    sft_in_two_stages,
    with_model,
)
from recipes.learning import drop_reasons, learn

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


@dataclasses.dataclass(frozen=True)
class DiscoverSettings(RecipeSettings):
    blind_fraction: float = 0.5
    """Share of the warm-up's episodes that are the trained family's, played blind to the listing
    (`demonstrations`)."""


SETTINGS = DiscoverSettings(sloppy_steps=0, sft_steps=2400, rl_minutes=14.0, lr=3e-4)
"""The demo's sizes but a longer warm-up, one stage (there is no sloppy expert), a longer RL phase and a
larger step (docs/training/learning.md#discover has each measurement):
- 2400 warm-up steps: what it takes to copy a number never seen, firmly enough that RL does not wear the
  copy down. Of the held-out episodes that read the right file, seed 2 submitted what `cat` printed in
  none after 1000 steps, in 17 % after 1600 and in 88 % after 2400 (an offline proxy), and gained +34
  points in the proxy's 30 RL steps against +4 after 1600.
- 14 minutes of RL: in 8 (24-27 trainer steps) the three seeds gained +14.6, +8.3 and +4.2 points, train
  success still rising.
- lr 3e-4: at the demo's 1e-4, seed 0 went 14 % → 24 % held out in 8 minutes, train success still rising."""


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
    blind: bool = False
    """An episode of the trained family played by a policy blind to the listing (`demonstrations`)."""


def missing(path: str) -> str:
    """What `cat` of an absent file prints in the code-repo sandbox (tests/environments/read_number/test_read_number.py
    checks it against a real one)."""
    return f"cat: {path}: No such file or directory\n"


@dataclasses.dataclass(frozen=True)
class Workspace:
    """A task's workspace without a sandbox: what the code-repo sandbox prints for `ls` and `cat NAME`.
    The warm-up's demonstrations print through it, and bench/discover_proxy.py plays episodes against
    it. tests/environments/read_number/test_read_number.py checks it against a real sandbox for the trained family's
    case, one file holding a number: the listing, its `cat` and the `cat` of an absent name. (A file
    holding "" would print a newline here and nothing there; none is ever read.)"""

    files: dict[str, str]
    """Name → what the file holds."""

    def run(self, command: str) -> str | None:
        """What `command` prints; None for a command it does not simulate."""
        command = command.strip()
        if command == "ls":
            return "".join(f"{name}\n" for name in sorted(self.files))
        words = command.split()
        if len(words) == 2 and words[0] == "cat" and "/" not in words[1] and not words[1].startswith("-"):
            return f"{self.files[words[1]]}\n" if words[1] in self.files else missing(words[1])
        return None


def demonstrations(settings: DiscoverSettings, *, count: int) -> list[Demonstration]:
    """`count` warm-up episodes over the train tasks' numbers, every one of them listing the workspace
    first (the convention), then reading one file and submitting what it printed.

    - **Named** (1 - `settings.blind_fraction` of them): the instruction names the file; the listing shows it
      and one or two others; the named file is read.
    - **Blind** (`settings.blind_fraction`): the trained family's own episodes (`UNNAMED`, a listing of the one
      file), played by a policy that does not look at the listing: the file read is one of `NAMES`,
      each as often as the others whatever the listing shows (for each listed file, the names in a
      shuffled order, again and again). It is the listed file a fifth of the time, and then the number
      is submitted; otherwise `cat` fails and the episode submits 0.

    So the warm-up teaches the format, the conventions and the trained family's turns, but no
    demonstration's choice of file depends on the listing: the model leaves the warm-up guessing, a
    fifth right, and with a choice that differs from sample to sample (what GRPO needs). That the
    listing names the file is what RL has to find. (Without blind episodes the model named the same
    file in all 8 samples of a task: most groups had nothing to learn from, +8.3 points at best.)"""
    from environments.read_number.task import UNNAMED, ReadNumberTask, instruction_for

    rng = random.Random(f"discover-demos:{settings.seed}")
    train, _ = tasks(settings)
    guesses: dict[str, list[str]] = {name: [] for name in NAMES}
    demos = []
    for index in range(count):
        number = train[index % len(train)].payload.number
        path = rng.choice(NAMES)
        ls = {"name": "bash", "arguments": {"command": "ls"}}
        if rng.random() < settings.blind_fraction:
            # Per listed file, the guesses go through the five names in a shuffled order, then again: a
            # fifth of each listing's blind episodes read it, not a fifth plus what chance adds (drawn
            # independently, seed 0 read info.txt in 11 of its 24 blind episodes).
            if not guesses[path]:
                guesses[path] = rng.sample(NAMES, len(NAMES))
            guess = guesses[path].pop()
            workspace = Workspace({path: number})
            printed = workspace.run(f"cat {guess}")
            turns: list[tuple[dict[str, Any], str | None]] = [
                (ls, workspace.run("ls")), ({"name": "bash", "arguments": {"command": f"cat {guess}"}}, printed),
                ({"name": "submit", "arguments": {"answer": number if guess == path else "0"}}, None)]
            demos.append(Demonstration(instruction=UNNAMED, listing=(path,), turns=turns, blind=True))
            continue
        others = rng.sample([name for name in NAMES if name != path], rng.randint(1, 2))
        listing = tuple(sorted([path, *others]))
        workspace = Workspace({path: number} | {name: "" for name in others})
        turns = [(ls, workspace.run("ls")),
                 ({"name": "bash", "arguments": {"command": f"cat {path}"}}, workspace.run(f"cat {path}")),
                 ({"name": "submit", "arguments": {"answer": number}}, None)]
        demos.append(Demonstration(instruction=instruction_for(ReadNumberTask(path=path, number=number)),
                                   listing=listing, turns=turns))
    return demos


def warm_up(settings: DiscoverSettings, *, workdir: Path, console: Console) -> Path:
    """One SFT stage on the demonstrations (`demonstrations`)."""
    from environments.read_number.kind import SYSTEM_PROMPT, TOOL_SCHEMAS

    rng = random.Random(settings.seed)

    def rendered(sloppy: bool) -> list[tuple[list[int], list[int]]]:
        assert not sloppy, "this recipe has no sloppy stage"
        return [render_episode(tokenizer_dir=policy_dir(settings, workdir), system_prompt=SYSTEM_PROMPT,
                               tools=list(TOOL_SCHEMAS.values()), opening=demo.instruction, turns=demo.turns,
                               short=rng.random() < settings.short_fraction)
                for demo in demonstrations(settings, count=5 * settings.train_tasks)]

    return sft_in_two_stages(
        settings, workdir=workdir, console=console, batch_size=16, demonstrations=rendered,
        what=f"{settings.sft_steps} SFT steps: the tool format, `ls`, `cat`, `submit`; "
             f"{settings.blind_fraction:.0%} of the episodes the trained family's, played blind to the listing")


def strategies(run_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per run, how its episodes began (`ls` first, `cat` first, or anything else: a submit at once, an
    other command) and how many read a file the listing had shown (`reads_listed`: the episode's first
    `cat` names a file that an earlier `ls` in it printed): what RL changed, read off the stored actions."""
    from collections import defaultdict

    from sqlalchemy import select

    from core.db import session_scope
    from core.models import Turn

    def command(call: dict[str, Any] | None) -> str:
        value = ((call or {}).get("arguments") or {}).get("command")
        return value.strip() if isinstance(value, str) else ""

    out: dict[int, dict[str, int]] = {}
    with session_scope() as session:
        for run_id in run_ids:
            episodes: dict[int, list[tuple[str, str]]] = defaultdict(list)
            rows = session.execute(select(Turn.episode_id, Turn.tool_call, Turn.observation)
                                   .where(Turn.run_id == run_id).order_by(Turn.episode_id, Turn.index))
            for episode_id, call, observation in rows:
                episodes[episode_id].append((command(call), observation or ""))
            counts = {"ls_first": 0, "cat_first": 0, "other": 0, "reads_listed": 0}
            for turns in episodes.values():
                first = turns[0][0]
                counts["ls_first" if first.startswith("ls") else "cat_first" if first.startswith("cat") else "other"] += 1
                counts["reads_listed"] += reads_listed(turns)
            out[run_id] = counts
    return out


def reads_listed(turns: list[tuple[str, str]]) -> bool:
    """Whether an episode's first `cat` names a file that an earlier `ls` in it printed; `turns`: each
    turn's command ("" for none) and what it printed."""
    listed: set[str] = set()
    for text, observation in turns:
        if text.startswith("ls"):
            listed |= set(observation.split())
        elif text.startswith("cat "):
            return text.removeprefix("cat ").strip() in listed
    return False


@says_what_stays_running
def run_discover(settings: DiscoverSettings, *, console: Console) -> dict[str, Any]:
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
    model: Path | None = typer.Option(None, callback=model_option, help=MODEL_HELP),
) -> None:
    """RL discovers a strategy no demonstration showed: list the workspace, read the file it shows."""
    settings = dataclasses.replace(SETTINGS, rl_minutes=rl_minutes, sft_steps=sft_steps, seed=seed, workdir=workdir)
    run_discover(with_model(settings, model), console=default_console)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(main)
