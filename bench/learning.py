"""Does RL here learn, by more than the noise between seeds? A recipe run over several seeds, end to end.

    .venv/bin/python bench/learning.py                         # the demo recipe, seeds 0 1 2
    .venv/bin/python bench/learning.py --recipe discover       # RL beyond the demonstrations (recipes/discover.py)
    .venv/bin/python bench/learning.py --recipe browser        # MiniWoB++ pages, one held out (recipes/browser_rl.py)
    .venv/bin/python bench/learning.py --recipe real           # discover on SmolLM2-135M-Instruct (recipes/real.py)
    .venv/bin/python bench/learning.py --seeds 0 1 2 3 4 --rl-minutes 5

Each seed runs the whole recipe (`recipes.demo.run_demo`, `recipes.discover.run_discover`,
`recipes.browser_rl.run_browser_rl` or `recipes.real.run_real`: warm-up,
held-out evaluation, RL, held-out evaluation) in a scratch database of its own (bench/store.py), one
seed after the other; the seed fixes
the tiny model's initialisation (a real model's weights are its own), the tasks and the sampling. Prints one JSON object: per seed the
held-out success before and after with their 95 % intervals (tasks resampled, `crucible eval`'s report)
and the wall-clock; over the seeds the mean gain in points with its 95 % interval (seeds resampled,
core.stats.mean_interval). With 3 seeds that interval is wide: it says how far the figure can be trusted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench.store import scratch_database
from core.stats import mean_interval
from recipes.common import RecipeSettings

DEFAULT_SEEDS = (0, 1, 2)
RECIPES = ("demo", "discover", "browser", "real")


def recipe(name: str) -> tuple[RecipeSettings, Callable[..., dict[str, Any]]]:
    """A recipe's default settings and its run function (`run(settings, console=…)`)."""
    if name == "demo":
        from recipes.demo import run_demo

        return RecipeSettings(), run_demo
    if name == "discover":
        from recipes.discover import SETTINGS, run_discover

        return SETTINGS, run_discover
    if name == "browser":
        from recipes.browser_rl import BrowserRLSettings, run_browser_rl

        return BrowserRLSettings(), run_browser_rl
    if name == "real":
        from recipes.real import SETTINGS, run_real

        return SETTINGS, run_real
    raise ValueError(f"recipe: expected one of {', '.join(RECIPES)}, got {name!r}")


def summary(per_seed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mean gain over seeds (points) with its 95 % interval (seeds resampled), and each seed's figures."""
    gains = [100 * (run["held_out_success_after"] - run["held_out_success_before"]) for run in per_seed]
    gain = mean_interval(gains)
    return {
        "seeds": len(per_seed),
        "gain_points": {"mean": round(gain.value, 1), "low": round(gain.low, 1), "high": round(gain.high, 1)},
        "gain_points_by_seed": [round(g, 1) for g in gains],
        "per_seed": [{key: run[key] for key in ("seed", "held_out_success_before", "held_out_interval_before",
                                                 "held_out_success_after", "held_out_interval_after",
                                                 "delta_points", "first_action_before", "first_action_after",
                                                 "held_out_by_page", "minutes", "wall_s") if key in run}
                     for run in per_seed],
    }


def over_seeds(seeds: Sequence[int], run_one: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """`run_one(seed)` for each seed, one after the other, each in a scratch database; then `summary`."""
    results = []
    for seed in seeds:
        with scratch_database(f"bench_learning_{seed}"):
            started = time.monotonic()
            result = run_one(seed)
        results.append({**result, "seed": seed, "wall_s": round(time.monotonic() - started, 1)})
    return summary(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="demo")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    parser.add_argument("--rl-minutes", type=float, default=None, help="Default: the recipe's own.")
    parser.add_argument("--workdir", type=Path, default=None, help="Default: a temporary directory.")
    args = parser.parse_args()

    defaults, run = recipe(args.recipe)
    rl_minutes = defaults.rl_minutes if args.rl_minutes is None else args.rl_minutes
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    log = Console(file=sys.stderr, width=160)

    def run_one(seed: int) -> dict[str, Any]:
        settings = dataclasses.replace(defaults, seed=seed, rl_minutes=rl_minutes, workdir=root / f"seed-{seed}")
        return run(settings, console=log)

    # Stdout carries the one JSON object: what the recipes' children print (image builds, the tiny
    # model's summary) goes to stderr with the log.
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        measured = over_seeds(args.seeds, run_one)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
        os.close(stdout)
    out = {"recipe": args.recipe, "rl_minutes": rl_minutes, **measured,
           "workdir": str(root)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
