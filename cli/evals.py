"""`crucible eval`: evaluate a model on an environment's held-out split, and report pass@1 and pass@k with
their 95 % intervals (overall, per environment, per difficulty bucket).

    crucible eval launch /models/tiny --environment read-number --samples 4    # an eval run; the controller
                                                                             # and a worker play it
    crucible eval show 12                       # the report (final once no episode is unfinished)
    crucible eval show 12 -o json

The report is api/services/run_eval.py's (the API serves it as GET /v1/runs/{id}/eval); the figures'
method is printed with it.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table
from sqlalchemy.orm import Session

from api.schemas.evals import EvalCell, EvalReport, RateEstimate
from cli.console import OutputFormat, OutputOption, console, print_json, safe
from cli.controller import _in_session

app = typer.Typer(help="Evaluate a model on held-out tasks: pass@1 and pass@k with 95 % intervals.",
                  no_args_is_help=True)


@app.command()
def launch(
    model: str = typer.Argument(..., help="The model the policy server serves (a path or a served name)."),
    environment: str = typer.Option(..., "--environment", "-e", help="Environment name."),
    samples: int = typer.Option(4, "--samples", "-k", min=1, max=1024, help="Episodes per task (pass@k's k)."),
    split: str = typer.Option("test", "--split", help="Task split to evaluate on."),
    version: int | None = typer.Option(None, "--version", min=1, help="Environment version (default: latest)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the episodes' sampling."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: eval-<environment>-<split>-<id>)."),
    output: OutputFormat = OutputOption,
) -> None:
    """Launch an eval run: SAMPLES episodes of every task of the split; the controller dispatches it."""
    from controller.evaluation import launch_eval

    def go(session: Session) -> dict[str, Any]:
        run = launch_eval(session, model=model, environment=environment, samples_per_task=samples, split=split,
                          version=version, seed=seed, name=name)
        return {"id": run.id, "name": run.name, "status": run.status, "k": run.group_size,
                "groups": run.config.get("max_groups")}

    launched = _in_session(go)
    if output is OutputFormat.json:
        print_json(launched)
    else:
        console.print(f"eval run {launched['id']} ({safe(launched['name'])}): {launched['groups']} tasks × "
                      f"{launched['k']} samples; `crucible eval show {launched['id']}` reports it", highlight=False)


@app.command()
def show(run_id: int = typer.Argument(..., help="Run id."), output: OutputFormat = OutputOption) -> None:
    """The report of an eval run: pass@1 and pass@k with 95 % intervals, by environment and bucket."""
    from api.services.run_eval import eval_report

    report: EvalReport = _in_session(lambda s: eval_report(s, run_id=run_id))
    if output is OutputFormat.json:
        print_json(report.model_dump(mode="json"))
        return
    table = Table(title=f"run {report.run_id} ({safe(report.purpose)}, {safe(report.status)}): "
                        f"{safe(report.model)} on split {safe(report.split)}, k = {report.k}")
    for column in ("", "tasks", "episodes", "solved", "excluded", "pass@1 [95 %]", f"pass@{report.k} [95 %]"):
        table.add_column(column, justify="left" if not column else "right")
    rows = [("all", report.overall), *((f"env {name}", cell) for name, cell in report.by_environment.items()),
            *((f"bucket {name}", cell) for name, cell in report.by_bucket.items())]
    for label, cell in rows:
        table.add_row(safe(label), *_cells(cell))
    console.print(table)
    if report.unfinished:
        console.print(f"{report.unfinished} episodes have not ended yet: the figures will move", highlight=False)
    console.print(report.method, highlight=False)


def _cells(cell: EvalCell) -> list[str]:
    return [str(cell.tasks), str(cell.episodes), str(cell.solved), str(cell.excluded),
            _rate(cell.pass_at_1), _rate(cell.pass_at_k)]


def _rate(rate: RateEstimate | None) -> str:
    return "–" if rate is None else f"{rate.value:.1%} [{rate.low:.1%}, {rate.high:.1%}]"
