"""`crucible run follow ID`: a run's progress, live, over the API — progress bars, a reward sparkline
and the termination breakdown, refreshed until the run stops (Ctrl-C leaves it running).

    crucible run follow 3               # live view
    crucible run follow 3 --once -o json
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import typer
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from cli.api_client import ApiClient, api_client
from cli.console import OutputFormat, OutputOption, console, readable_errors

ACTIVE = ("pending", "running")
ENDED = ("completed", "failed", "cancelled")
SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60


def sparkline(values: list[float | None], *, width: int = SPARK_WIDTH) -> str:
    """One character per value (the last `width`), scaled between their min and max; gaps as spaces."""
    shown = values[-width:]
    numbers = [v for v in shown if v is not None]
    if not numbers:
        return ""
    low, high = min(numbers), max(numbers)
    span = (high - low) or 1.0
    return "".join(" " if v is None else SPARKS[round((v - low) / span * (len(SPARKS) - 1))] for v in shown)


def snapshot(client: ApiClient, run_id: int) -> dict[str, Any]:
    """What one refresh shows: the run with its summary, and the reward per step (or version)."""
    run = client.get(f"/v1/runs/{run_id}")
    metrics = client.get(f"/v1/runs/{run_id}/metrics")
    points = metrics["points"]
    return {"run": run, "axis": metrics["axis"], "reward": [p["reward_mean"] for p in points],
            "termination": points[-1]["termination"] if points else {}}


def _counts(run: dict[str, Any]) -> tuple[int, int, int, int | None]:
    summary = run["summary"]
    episodes, groups = summary["episodes"], summary["groups"]
    ended = sum(episodes.get(status, 0) for status in ENDED)
    done_groups = sum(count for status, count in groups.items() if status != "running")
    return ended, sum(episodes.values()), done_groups, run["config"].get("max_groups")


def render(snap: dict[str, Any], progress: Progress, tasks: dict[str, Any]) -> Group:
    run = snap["run"]
    ended, total, done_groups, budget = _counts(run)
    progress.update(tasks["episodes"], completed=ended, total=max(total, 1))
    progress.update(tasks["groups"], completed=done_groups, total=budget or max(sum(run["summary"]["groups"].values()), 1))
    summary = run["summary"]
    mean = "–" if summary["reward_mean"] is None else f"{summary['reward_mean']:.3f}"
    header = Text.assemble((f"run {run['id']} {run['name']}", "bold"), f" · {run['status']} · policy version ",
                           (str(run["policy_version"]), "bold"), f" · {summary['training_steps']} training steps")
    spark = Text.assemble(f"reward by {snap['axis']}  ", (sparkline(snap["reward"]), "green"), f"  mean {mean}")
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(snap["termination"].items())) or "–"
    waiting = run.get("waiting_for_trainer")  # a train run with nobody training it says so
    note = [Text(waiting, style="bold yellow")] if waiting else []
    return Group(header, *note, progress, spark, Text(f"latest terminations: {reasons}", style="dim"))


def _progress() -> tuple[Progress, dict[str, Any]]:
    progress = Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), console=console)
    tasks = {"episodes": progress.add_task("episodes ended", total=1), "groups": progress.add_task("groups done", total=1)}
    return progress, tasks


def follow(
    run_id: int = typer.Argument(..., help="Run id."),
    interval: float = typer.Option(2.0, min=0.2, help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Show the current state and exit."),
    output: OutputFormat = OutputOption,
) -> None:
    """Follow a run live: progress bars and a reward sparkline until it stops."""
    client = api_client()
    with readable_errors():
        snap = snapshot(client, run_id)
    if output is OutputFormat.json:
        _follow_json(client, run_id, snap, interval=interval, once=once)
        return
    progress, tasks = _progress()
    with Live(render(snap, progress, tasks), console=console, refresh_per_second=4, transient=False) as live:
        try:
            while not once and snap["run"]["status"] in ACTIVE:
                time.sleep(interval)
                with readable_errors():
                    snap = snapshot(client, run_id)
                live.update(render(snap, progress, tasks))
        except KeyboardInterrupt:
            pass


def _follow_json(client: ApiClient, run_id: int, snap: dict[str, Any], *, interval: float, once: bool) -> None:
    """JSON lines: one object per refresh."""
    while True:
        sys.stdout.write(json.dumps(snap, default=str) + "\n")
        sys.stdout.flush()
        if once or snap["run"]["status"] not in ACTIVE:
            return
        time.sleep(interval)
        with readable_errors():
            snap = snapshot(client, run_id)
