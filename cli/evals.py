"""`crucible eval`: evaluate a model on an environment's held-out split, and report pass@1 and pass@k with
their 95 % intervals (overall, per environment, per difficulty bucket).

    crucible eval launch /models/tiny --environment read-number --samples 4    # an eval run; the controller
                                                                             # and a worker play it
    crucible eval launch --run 7 --step 40 -e read-number    # training run 7's checkpoint at step 40: loaded
                                                             # into every policy server first (probed), and
                                                             # shown beside the other steps on run 7's page
    crucible eval show 12                       # the report (final once no episode is unfinished)
    crucible eval show 12 -o json

The report is api/services/run_eval.py's (the API serves it as GET /v1/runs/{id}/eval); the figures'
method is printed with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from sqlalchemy.orm import Session

from api.schemas.evals import CheckpointComparison, EvalCell, EvalReport, RateEstimate
from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors, safe
from cli.controller import _in_session
from controller.runs import get_run
from core.errors import ConfigError
from core.schemas.run import RecordedStep

app = typer.Typer(help="Evaluate a model on held-out tasks: pass@1 and pass@k with 95 % intervals.",
                  no_args_is_help=True)


@app.command()
def launch(
    model: str | None = typer.Argument(None, help="The model the policy server serves (a path or a served name); "
                                       "or --run and --step for a training run's checkpoint."),
    environment: str = typer.Option(..., "--environment", "-e", help="Environment name."),
    samples: int = typer.Option(4, "--samples", "-k", min=1, max=1024, help="Episodes per task (pass@k's k)."),
    split: str = typer.Option("test", "--split", help="Task split to evaluate on."),
    version: int | None = typer.Option(None, "--version", min=1, help="Environment version (default: latest)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the episodes' sampling."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: eval-<environment>-<split>-<id>)."),
    run: int | None = typer.Option(None, "--run", min=1, help="A training run whose checkpoint to evaluate."),
    step: int | None = typer.Option(None, "--step", min=0, help="With --run: the training step (0: its starting "
                                    "weights; the trainer keeps the newest and every config.trainer.keep_every-th)."),
    policy_dir: list[Path] | None = typer.Option(
        None, help="With --run: the model directory each policy server loaded (the checkpoint is written there), "
        "as for `crucible trainer`."),
    output: OutputFormat = OutputOption,
) -> None:
    """Launch an eval run: SAMPLES episodes of every task of the split; the controller dispatches it. With
    --run and --step, the checkpoint is loaded into every policy server first (no training run may be
    active: its trainer would push its own weights), and the workers keep only turns sampled by it."""
    from controller.evaluation import launch_eval

    with readable_errors():
        checkpoint = _checkpoint(model=model, run=run, step=step, policy_dirs=list(policy_dir or []))

    def go(session: Session) -> dict[str, Any]:
        launched = launch_eval(session, model=checkpoint.model if checkpoint else str(model), environment=environment,
                               samples_per_task=samples, split=split, version=version, seed=seed, name=name,
                               checkpoint=checkpoint.ref if checkpoint else None)
        return {"id": launched.id, "name": launched.name, "status": launched.status, "k": launched.group_size,
                "groups": launched.config.get("max_groups"),
                "checkpoint": checkpoint.ref.model_dump() if checkpoint else None}

    launched = _in_session(go)
    if output is OutputFormat.json:
        print_json(launched)
    else:
        of = f" of run {run} step {step}" if checkpoint else ""
        console.print(f"eval run {launched['id']} ({safe(launched['name'])}){of}: {launched['groups']} tasks × "
                      f"{launched['k']} samples; `crucible eval show {launched['id']}` reports it", highlight=False)


def _checkpoint(*, model: str | None, run: int | None, step: int | None,
                policy_dirs: list[Path]) -> RecordedStep | None:
    """None for a model; for --run/--step, the step, once its checkpoint serves on every policy server."""
    if run is None and step is None:
        if model is None:
            raise ConfigError("expected MODEL, or --run and --step for a training run's checkpoint; got neither")
        return None
    if model is not None or run is None or step is None:
        given = ", ".join(f"{flag} {value}" for flag, value in (("MODEL", model), ("--run", run), ("--step", step))
                          if value is not None)
        raise ConfigError(f"expected MODEL alone, or --run and --step together; got {given}")
    import dataclasses

    from cli.trainer import build_publisher
    from controller.evaluation import check_servers_free, recorded_step
    from core.db import session_scope
    from core.settings import get_settings
    from core.versions import checkpoint_tag
    from trainer.checkpoint_eval import checkpoint_engine, serve_checkpoint
    from trainer.config import trainer_config

    with session_scope() as session:
        recorded = recorded_step(session, run_id=run, step=step)
        check_servers_free(session)
        stored = get_run(session, run_id=run).config
        config = trainer_config(stored.get("trainer") or {}, source=f"run {run} config.trainer")
    engine = checkpoint_engine(recorded, config=config)
    recorded = dataclasses.replace(recorded, ref=recorded.ref.model_copy(update={"tag": checkpoint_tag()}))
    settings = get_settings()
    publisher = build_publisher(model=recorded.model, policy_urls=settings.policy_pool, policy_dirs=policy_dirs,
                                fallback_dir=settings.policy_tokenizer)
    try:
        report = serve_checkpoint(engine, step=recorded, publisher=publisher)
    finally:
        publisher.close()
    console.print(f"run {run} step {step} (version {recorded.ref.version}) serves under label {recorded.ref.tag} on "
                  f"{len(report.replicas)} policy servers (loaded and probed in {report.seconds:.1f} s)", highlight=False)
    return recorded


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
    if report.checkpoint is not None:
        console.print(f"checkpoint of run {report.checkpoint.run_id} at step {report.checkpoint.step} (version "
                      f"{report.checkpoint.version}, served under label {report.checkpoint.tag})", highlight=False)
    if report.unfinished:
        console.print(f"{report.unfinished} episodes have not ended yet: the figures will move", highlight=False)
    console.print(report.method, highlight=False)


@app.command()
def checkpoints(run_id: int = typer.Argument(..., help="Training run id."), output: OutputFormat = OutputOption) -> None:
    """A training run's evaluated checkpoints by step: pass@1 and pass@k with 95 % intervals (as its page
    charts them)."""
    from api.services.run_eval import checkpoint_evals

    comparison: CheckpointComparison = _in_session(lambda s: checkpoint_evals(s, run_id=run_id))
    if output is OutputFormat.json:
        print_json(comparison.model_dump(mode="json"))
        return
    if not comparison.evals:
        console.print(f"no checkpoint of run {run_id} evaluated yet: `crucible eval launch --run {run_id} --step S "
                      "-e ENV`", highlight=False)
        return
    table = Table(title=f"run {run_id}: checkpoints evaluated")
    for column in ("step", "eval run", "environments", "split", "k", "status", "episodes", "pass@1 [95 %]",
                   "pass@k [95 %]"):
        table.add_column(column, justify="right" if column in ("step", "eval run", "k", "episodes") else "left")
    for point in comparison.evals:
        report = point.report
        table.add_row(str(point.step), str(report.run_id), safe(", ".join(report.environments)), safe(report.split),
                      str(report.k), safe(report.status), str(report.overall.episodes),
                      _rate(report.overall.pass_at_1), _rate(report.overall.pass_at_k))
    console.print(table)


def _cells(cell: EvalCell) -> list[str]:
    return [str(cell.tasks), str(cell.episodes), str(cell.solved), str(cell.excluded),
            _rate(cell.pass_at_1), _rate(cell.pass_at_k)]


def _rate(rate: RateEstimate | None) -> str:
    return "–" if rate is None else f"{rate.value:.1%} [{rate.low:.1%}, {rate.high:.1%}]"
