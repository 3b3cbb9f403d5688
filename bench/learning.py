"""Does RL here learn, by more than the noise between seeds? A recipe run over several seeds, end to end.

    .venv/bin/python bench/learning.py                         # the demo recipe, seeds 0 1 2
    .venv/bin/python bench/learning.py --recipe discover       # RL beyond the demonstrations (recipes/discover.py)
    .venv/bin/python bench/learning.py --recipe browser        # MiniWoB++ pages, one held out (recipes/browser_rl.py)
    .venv/bin/python bench/learning.py --recipe real           # discover on SmolLM2-135M-Instruct (recipes/real.py)
    .venv/bin/python bench/learning.py --seeds 0 1 2 3 4 --rl-minutes 5
    .venv/bin/python bench/learning.py --recipe real --results ~/bench-real   # again after a break: goes on

Each seed runs the whole recipe (`recipes.demo.run_demo`, `recipes.discover.run_discover`,
`recipes.browser_rl.run_browser_rl` or `recipes.real.run_real`: warm-up,
held-out evaluation, RL, held-out evaluation) in a scratch database of its own (bench/store.py), one
seed after the other; the seed fixes
the tiny model's initialisation (a real model's weights are its own), the tasks and the sampling. Prints one JSON object: per seed the
held-out success before and after with their 95 % intervals (tasks resampled, `crucible eval`'s report)
and the wall-clock; over the seeds the mean gain in points with its 95 % interval (seeds resampled,
core.stats.mean_interval). With 3 seeds that interval is wide: it says how far the figure can be trusted.
On a pretrained model (`--recipe real`) each seed also evaluates the model as imported: `warm_up_points`
and `total_points` say what the warm-up, and warm-up and RL together, add to it.

A seed of the real recipe takes most of an hour on 2 cores; `--results DIR` keeps each finished seed
(its result, settings and commit) and a later invocation with the same settings reads it back instead
of running it again, each such seed marked `kept` in the output.
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
    def points(key: str, base: str) -> dict[str, Any]:
        values = [100 * (run[key] - run[base]) for run in per_seed]
        interval = mean_interval(values)
        return {"mean": round(interval.value, 1), "low": round(interval.low, 1), "high": round(interval.high, 1),
                "by_seed": [round(value, 1) for value in values]}

    gain = points("held_out_success_after", "held_out_success_before")
    out: dict[str, Any] = {
        "seeds": len(per_seed),
        "gain_points": {key: gain[key] for key in ("mean", "low", "high")},
        "gain_points_by_seed": gain["by_seed"],
    }
    if per_seed and all("held_out_success_raw" in run for run in per_seed):  # a pretrained model: what each stage adds
        out["warm_up_points"] = points("held_out_success_before", "held_out_success_raw")
        out["total_points"] = points("held_out_success_after", "held_out_success_raw")
    out["per_seed"] = [{key: run[key] for key in ("seed", "held_out_success_raw", "held_out_interval_raw",
                                                  "held_out_success_before", "held_out_interval_before",
                                                  "held_out_success_after", "held_out_interval_after",
                                                  "delta_points", "first_action_before", "first_action_after",
                                                  "held_out_by_page", "minutes", "wall_s", "kept") if key in run}
                       for run in per_seed]
    return out


def over_seeds(seeds: Sequence[int], run_one: Callable[[int], dict[str, Any]], *,
               kept: Callable[[int], dict[str, Any] | None] = lambda seed: None,
               keep: Callable[[int, dict[str, Any]], None] = lambda seed, result: None) -> dict[str, Any]:
    """`run_one(seed)` for each seed, one after the other, each in a scratch database; then `summary`.
    A seed `kept` returns a result for (one an earlier invocation finished, `--results`) is not run again."""
    results = []
    for seed in seeds:
        result = kept(seed)
        if result is None:
            with scratch_database(f"bench_learning_{seed}"):
                started = time.monotonic()
                result = run_one(seed)
            result = {**result, "seed": seed, "wall_s": round(time.monotonic() - started, 1)}
            keep(seed, result)
        results.append(result)
    return summary(results)


def settings_key(settings: RecipeSettings) -> dict[str, Any]:
    """What makes two runs of a recipe the same run: its settings (but where it writes), as JSON."""
    fields = dataclasses.asdict(settings)
    fields.pop("workdir", None)
    return json.loads(json.dumps(fields, default=str))


def kept_result(results: Path, *, recipe: str, settings: RecipeSettings, console: Console) -> dict[str, Any] | None:
    """The result `keep_result` kept for this recipe and settings' seed, marked `kept` with its commit and
    time; None where there is none, or one of another recipe or other settings (that seed runs again)."""
    path = results / f"seed-{settings.seed}.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        same = record["recipe"] == recipe and record["settings"] == settings_key(settings)
        result = record["result"]
    except (ValueError, KeyError, TypeError) as error:
        console.print(f"{path}: expected a kept seed's record, got {str(error)[:120]}; seed {settings.seed} runs again")
        return None
    if not same:
        console.print(f"{path}: kept for another recipe or other settings; seed {settings.seed} runs again")
        return None
    console.print(f"seed {settings.seed}: kept in {path} (commit {record.get('commit')}, {record.get('finished')})")
    return {**result, "kept": {"commit": record.get("commit"), "finished": record.get("finished")}}


def keep_result(results: Path, *, recipe: str, settings: RecipeSettings, result: dict[str, Any]) -> None:
    """Write a finished seed's result with what it was run with (recipe, settings, commit, time)."""
    results.mkdir(parents=True, exist_ok=True)
    record = {"recipe": recipe, "settings": settings_key(settings), "commit": commit(),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "result": result}
    path = results / f"seed-{settings.seed}.json"
    path.with_suffix(".tmp").write_text(json.dumps(record, indent=2) + "\n")
    path.with_suffix(".tmp").replace(path)  # a seed cut off mid-write is never read back half-written


def commit() -> str | None:
    """The checkout's commit, with `+` where the tree has uncommitted changes; None outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="demo")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    parser.add_argument("--rl-minutes", type=float, default=None, help="Default: the recipe's own.")
    parser.add_argument("--workdir", type=Path, default=None, help="Default: a temporary directory.")
    parser.add_argument("--results", type=Path, default=None,
                        help="Keep each finished seed's result here (seed-N.json, with its settings and commit), "
                             "and read back, not run again, a seed kept with the same settings: a bench longer "
                             "than one sitting goes on where it stopped.")
    args = parser.parse_args()

    defaults, run = recipe(args.recipe)
    rl_minutes = defaults.rl_minutes if args.rl_minutes is None else args.rl_minutes
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    log = Console(file=sys.stderr, width=160)

    def settings_for(seed: int) -> RecipeSettings:
        return dataclasses.replace(defaults, seed=seed, rl_minutes=rl_minutes, workdir=root / f"seed-{seed}")

    def run_one(seed: int) -> dict[str, Any]:
        return run(settings_for(seed), console=log)

    def kept(seed: int) -> dict[str, Any] | None:
        return None if args.results is None else kept_result(args.results, recipe=args.recipe,
                                                                 settings=settings_for(seed), console=log)

    def keep(seed: int, result: dict[str, Any]) -> None:
        if args.results is not None:
            keep_result(args.results, recipe=args.recipe, settings=settings_for(seed), result=result)

    # Stdout carries the one JSON object: what the recipes' children print (image builds, the tiny
    # model's summary) goes to stderr with the log.
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        measured = over_seeds(args.seeds, run_one, kept=kept, keep=keep)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
        os.close(stdout)
    out = {"recipe": args.recipe, "rl_minutes": rl_minutes, **measured,
           "workdir": str(root)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
