"""`make demo`: watch a tiny model learn a multi-turn tool task with real RL on this machine.

    make demo                                        # = scripts/setup.sh, then .venv/bin/python -m recipes.demo
    .venv/bin/python -m recipes.demo --rl-minutes 5 --seed 0
    .venv/bin/python -m recipes.demo --model ~/models/SmolLM2-135M-Instruct   # a model of your own

On the embedded default (no CRUCIBLE_DATABASE_URL: embedded Postgres, Celery on its SQLAlchemy
transport): builds the sandbox images, makes a tiny model (`crucible model init-tiny`), warms it up
with a short SFT on synthetic demonstrations (`warm_up`), registers the `read_number` environment and
its train/held-out tasks (`register`), then runs real RL — controller + task worker (Docker sandboxes)
+ trainer + vLLM on CPU — printing a live view of the steps and the held-out success rate before and
after. The runs stay in the store (`crucible run ls`). The shared steps live in recipes/common.py.
"""

from __future__ import annotations

import json
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
    says_what_stays_running,
    settled,
    sft_in_two_stages,
    tokenizers,
    with_model,
)
from recipes.learning import drop_reasons, learn

ENV_NAME = "read-number"
ENV_SPEC: dict[str, Any] = {
    "name": ENV_NAME, "kind": "read_number", "image": "code-repo",
    "description": "Read the number a file holds and submit it (bash + submit).",
    "sandbox": {"memory": "256m", "pids": 64, "workspace_size": "16m", "tmp_size": "16m", "max_lifetime_s": 3600},
    "limits": {"max_turns": 3, "max_context_tokens": 1024, "max_response_tokens": 48, "episode_timeout_s": 60,
               "tool_timeout_s": 5, "max_tool_errors": 2},
    "verifier": {"weights": {"answer": 1.0}},
}


def demonstrations(settings: RecipeSettings, *, tokenizer: Any, count: int, guess_fraction: float,
                   seed: int) -> list[tuple[list[int], list[int]]]:
    """`count` demonstrations over the train tasks: a `guess_fraction` of them submit a made-up number
    without reading the file (one turn, reward 0), the rest read it and submit what it says. Most are
    rendered short (no tool schemas in the prompt): the same assistant turns for a sixth of the compute."""
    import random

    from environments.read_number.demos import demonstration
    from task_workers.policy.chat import observation_text

    rng = random.Random(seed)
    train, _ = demo_tasks(settings)
    low, high = settings.digits
    demos = []
    for index in range(count):
        task = train[index % len(train)]
        guess = str(rng.randrange(10 ** (low - 1), 10**high)) if rng.random() < guess_fraction else None
        demos.append(demonstration(task, tokenizer=tokenizer, observation_text=observation_text, guess=guess,
                                   short=rng.random() < settings.short_fraction))
    return demos


def warm_up(settings: RecipeSettings, *, workdir: Path, console: Console) -> Path:
    """Two SFT stages: an expert who always reads the file (the model learns the tool format and to copy
    the number), then a few steps of a sloppy expert who half the time guesses instead (the model
    learns to guess too). RL then has to find out that reading pays."""
    tokenizer = tokenizers(policy_dir(settings, workdir))[0]

    def demos(sloppy: bool) -> list[tuple[list[int], list[int]]]:
        if sloppy:
            return demonstrations(settings, tokenizer=tokenizer, count=400, guess_fraction=settings.guess_fraction,
                                  seed=settings.seed + 1)
        return demonstrations(settings, tokenizer=tokenizer, count=5 * settings.train_tasks, guess_fraction=0.0,
                              seed=settings.seed)

    return sft_in_two_stages(
        settings, workdir=workdir, console=console, batch_size=16, demonstrations=demos,
        what=f"{settings.sft_steps} SFT steps on an expert's demonstrations, {settings.sloppy_steps} on a "
             f"sloppy expert's ({settings.guess_fraction:.0%} guesses)")


def demo_tasks(settings: RecipeSettings) -> tuple[list[Any], list[Any]]:
    """The demo's (train, held-out) read_number tasks for `settings` (the fleet test's too)."""
    from environments.read_number.task import make_splits

    return make_splits(train=settings.train_tasks, test=settings.test_tasks, seed=settings.seed,
                       digits=settings.digits, file_names=("number.txt",))


def demo(
    rl_minutes: float = typer.Option(5.0, help="Wall-clock budget of the RL phase."),
    sft_steps: int = typer.Option(1000, help="Warm-up optimizer steps."),
    seed: int = typer.Option(0, help="Seed of the model, the tasks and the run."),
    workdir: Path | None = typer.Option(None, help="Default: <data dir>/demo/<timestamp>."),
    model: Path | None = typer.Option(None, callback=model_option, help=MODEL_HELP),
) -> None:
    """Watch a tiny model learn a multi-turn tool task with real RL (about 15 minutes on 2 cores)."""
    settings = with_model(RecipeSettings(rl_minutes=rl_minutes, sft_steps=sft_steps, seed=seed, workdir=workdir),
                          model)
    run_demo(settings, console=default_console)


@says_what_stays_running
def run_demo(settings: RecipeSettings, *, console: Console) -> dict[str, Any]:
    """Every stage of the demo with these settings; returns what it writes to result.json."""
    settings = settled(settings, name="demo")
    began = time.monotonic()
    path = prepare(settings, console=console)
    warm = warm_up(settings, workdir=path, console=console)
    counts = register(ENV_SPEC, demo_tasks(settings))
    console.print(f"  tasks: {counts['train']} train, {counts['test']} held-out ({ENV_NAME})")
    learned = learn(settings, path=path, warm=warm, environment=ENV_NAME, prefix="demo", console=console)
    before, after, run_id = learned.before, learned.after, learned.run_id
    dropped = drop_reasons(run_id)
    result = {**learned.figures(), "minutes": round((time.monotonic() - began) / 60, 1), "dropped_groups": dropped,
              "curve": learned.curve}
    console.print("  groups not trained on, by reason: " + (", ".join(f"{reason} {n}" for reason, n in dropped.items())
                                                            or "none"))
    (path / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"\n[bold]held-out success: {before.success:.0%} [{before.low:.0%}–{before.high:.0%}] → "
                  f"{after.success:.0%} [{after.low:.0%}–{after.high:.0%}] ({result['delta_points']:+.1f} points)[/] "
                  f"in {result['minutes']} min. Run {run_id} stays in the store (`crucible run show {run_id}`); "
                  f"curve and numbers in {path / 'result.json'}")
    return result


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(demo)
