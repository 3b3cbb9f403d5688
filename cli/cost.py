"""`crucible run cost RUN`: what each training step cost, by stage, and a GPU-hours projection.

    crucible run cost 7                          # the last 20 steps, totals, FLOP/s, MFU
    crucible run cost 7 --target-steps 1000 --gpus 8 -o json

Every figure is one the trainer recorded for the step (`cost/…` in training_steps.metrics, see
trainer/cost.py): rollout seconds are episode-seconds summed over the step's trained episodes (they
ran in parallel, so they may exceed the step's wall-clock), update and reference seconds are the
trainer's, reward seconds the grading time of those episodes. FLOPs = 6·N_active·update tokens +
2·N_active·reference tokens; MFU only where the device's peak is known (null on CPU).

Projection: trainer.cost.PROJECTION_FORMULA, printed with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.table import Table

from cli.console import OutputFormat, OutputOption, console, print_json

if TYPE_CHECKING:  # the API's modules are imported where they are used: the CLI starts fast
    from api.schemas.runs import RunCost


def _fmt(value: float | None, *, digits: int = 3) -> str:
    if value is None:
        return "–"
    if abs(value) >= 1e6:
        return f"{value:.3g}"
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def _render(view: RunCost, *, last: int) -> None:
    from api.services.run_cost import STAGE_KEYS

    rows = view.steps
    if not rows:
        console.print(f"run {view.run_id}: no training step has recorded its cost yet"
                      + (f" ({view.steps_without_cost} steps recorded before cost metrics)"
                         if view.steps_without_cost else ""), highlight=False)
        return
    table = Table(title=f"run {view.run_id}: cost per step (last {min(last, len(rows))} of {len(rows)})")
    table.add_column("step", justify="right")
    for stage in STAGE_KEYS:
        table.add_column(f"{stage} s", justify="right")
        table.add_column("episodes" if stage == "reward" else f"{stage} tokens", justify="right")
    for name in ("step s", "FLOPs", "FLOP/s", "MFU"):
        table.add_column(name, justify="right")
    for row in rows[-last:]:
        cells = [str(row.step)]
        for stage in STAGE_KEYS:
            cells += [_fmt(row.stages[stage].seconds), _fmt(row.stages[stage].work)]
        cells += [_fmt(row.step_seconds), _fmt(row.flops), _fmt(row.flops_per_s), _fmt(row.mfu)]
        table.add_row(*cells)
    console.print(table)
    totals = Table(title=f"totals over all {len(rows)} steps")
    for name in ("stage", "seconds", "share", "tokens / episodes"):
        totals.add_column(name, justify="right" if name != "stage" else "left")
    for stage, total in view.totals.items():
        share = f"{100 * total.share:.1f}%" if total.share is not None else "–"
        totals.add_row(stage, _fmt(total.seconds), share, _fmt(total.work))
    console.print(totals)
    console.print(f"FLOPs {_fmt(view.flops)} · median FLOP/s {_fmt(view.flops_per_s_median)} · "
                  f"median MFU {_fmt(view.mfu_median)} · median step {_fmt(view.step_seconds_median)} s",
                  highlight=False)
    projection = view.projection
    if projection is not None:
        console.print(f"projection: {projection.target_steps} steps on {projection.gpus} GPU(s) ≈ "
                      f"{projection.gpu_hours:.2f} GPU-hours ({projection.formula})", highlight=False)


def cost(
    run_id: int = typer.Argument(..., help="Run id."),
    target_steps: int | None = typer.Option(None, "--target-steps", min=1,
                                            help="Project the GPU-hours of this many steps (its formula is printed with it)."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs the run trains on (for the projection)."),
    last: int = typer.Option(20, "--last", min=1, help="Steps shown in the table (totals cover all)."),
    output: OutputFormat = OutputOption,
) -> None:
    """Cost per training step by stage (rollout, update, reference, reward), FLOP/s, MFU, GPU-hours."""
    from api.services.run_cost import run_cost
    from cli.controller import _in_session

    view: RunCost = _in_session(lambda s: run_cost(s, run_id=run_id, target_steps=target_steps, gpus=gpus))
    if output is OutputFormat.json:
        print_json(view.model_dump())
    else:
        _render(view, last=last)
