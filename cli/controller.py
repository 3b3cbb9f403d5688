"""`crucible controller` (the scheduling loop) and `crucible run …` (launch, ls, show, stop, resume,
archive, restore; `crucible runs …` is the same group).

    crucible controller --poll 1.0          # runs until Ctrl-C; --once for a single pass
    crucible run launch run.yaml -o json
    crucible runs archive 42                # a finished run's turns → Parquet (core/archive.py)
    crucible runs points                    # store the run-page points of steps from before 0008
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from sqlalchemy.orm import Session

from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors, safe
from controller.config import ControllerConfig, load_run_config
from controller.progress import describe_run
from controller.runs import create_run, get_run, list_runs, resume_run, stop_run

runs_app = typer.Typer(help="Runs: launch, list, inspect, stop, resume, archive, restore, points.",
                       no_args_is_help=True)


def controller(
    poll: float = typer.Option(1.0, "--poll", min=0.05, help="Seconds between passes."),
    once: bool = typer.Option(False, "--once", help="Do one pass and exit."),
    heartbeat_timeout: float = typer.Option(30.0, min=1.0, help="Seconds after which a silent worker is dead."),
    max_attempts: int = typer.Option(3, min=1, help="Times an episode may be lost before it fails."),
    output: OutputFormat = OutputOption,
) -> None:
    """Schedule runs: dispatch groups, bound staleness, reconcile lost episodes (leader only)."""
    from controller.dispatcher import celery_dispatcher
    from controller.loop import Controller
    from core.db import check_database, get_engine

    with readable_errors():
        engine = get_engine()
        check_database(engine)
        settings = ControllerConfig(heartbeat_timeout_s=heartbeat_timeout, max_attempts=max_attempts)
        loop = Controller(engine=engine, dispatcher=celery_dispatcher(), settings=settings)
    if once:
        try:
            report = loop.step()
        finally:
            loop.close()
        if output is OutputFormat.json:
            print_json(asdict(report))
        else:
            console.print(f"leader={report.leader} dispatched={report.dispatched} resent={report.resent} "
                          f"failed={report.failed} finished={report.finished}", highlight=False)
        return
    # SIGTERM (`docker stop`, systemd, a pod's end) ends the loop between passes, as Ctrl-C does mid-pass:
    # run_forever releases the leader lock on the way out, so a standby takes over at once. Without this a
    # controller that is a container's first process would ignore SIGTERM and be killed past its grace period.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        loop.run_forever(poll_s=poll, stop=stop)


def _in_session(fn: Callable[[Session], Any]) -> Any:
    from core.db import session_scope

    with readable_errors(), session_scope() as session:
        return fn(session)


def _show(views: list[dict[str, Any]], output: OutputFormat, *, single: bool = False) -> None:
    if output is OutputFormat.json:
        print_json(views[0] if single else views)
        return
    table = Table(title="runs" if not single else f"run {views[0]['id']}")
    for column in ("id", "name", "status", "purpose", "mode", "version", "groups", "environments"):
        table.add_column(column, overflow="fold")
    for view in views:
        groups = ", ".join(f"{status} {count}" for status, count in sorted(view["groups"].items())) or "-"
        if view.get("dropped_by_reason"):  # why the dropped ones were not trained on (core.termination.DropReason)
            groups += " (dropped: " + ", ".join(f"{reason} {n}" for reason, n in view["dropped_by_reason"].items()) + ")"
        envs = ", ".join(f"{e['name']} v{e['version']} ×{e['weight']:g}" for e in view["environments"])
        table.add_row(str(view["id"]), safe(view["name"]), safe(view["status"]), safe(view["purpose"]),
                      safe(view["mode"]), str(view["policy_version"]), safe(groups), safe(envs))
    console.print(table)


@runs_app.command()
def launch(
    config_file: Path = typer.Argument(..., help="Run config, YAML or JSON (see core/schemas/run.py)."),
    output: OutputFormat = OutputOption,
) -> None:
    """Create a run from CONFIG_FILE; the controller starts dispatching it."""
    with readable_errors():
        config = load_run_config(config_file)
    _show([_in_session(lambda s: describe_run(s, create_run(s, config=config), detail=True))], output, single=True)


@runs_app.command("ls")
def list_(
    status: str | None = typer.Option(None, "--status", help="Only runs in this status."),
    limit: int = typer.Option(100, min=1, help="Most runs to list, newest first."),
    output: OutputFormat = OutputOption,
) -> None:
    """List runs, newest first."""
    _show(_in_session(lambda s: [describe_run(s, run) for run in list_runs(s, status=status, limit=limit)]), output)


@runs_app.command()
def show(run_id: int = typer.Argument(..., help="Run id."), output: OutputFormat = OutputOption) -> None:
    """Show a run: its status, environments, groups and episodes by status, and resolved config."""
    _show([_in_session(lambda s: describe_run(s, get_run(s, run_id=run_id), detail=True))], output, single=True)


@runs_app.command()
def stop(run_id: int = typer.Argument(..., help="Run id."), output: OutputFormat = OutputOption) -> None:
    """Stop dispatching a run; episodes in flight finish."""
    _show([_in_session(lambda s: describe_run(s, stop_run(s, run_id=run_id)))], output, single=True)


@runs_app.command()
def resume(run_id: int = typer.Argument(..., help="Run id."), output: OutputFormat = OutputOption) -> None:
    """Resume a stopped run."""
    _show([_in_session(lambda s: describe_run(s, resume_run(s, run_id=run_id)))], output, single=True)


@runs_app.command("pass-rate")
def pass_rate(
    environment: str = typer.Argument(..., help="Environment name."),
    model: str = typer.Option(..., "--model", help="Policy model (directory or served name)."),
    samples: int = typer.Option(8, "--samples", min=1, max=1024, help="Episodes per task."),
    split: str = typer.Option("train", "--split", help="Task split to measure."),
    threshold: float = typer.Option(1.0, "--threshold", help="Score counted as a pass."),
    component: str | None = typer.Option(None, "--component", help="Score this reward component, e.g. hidden_tests."),
    output: OutputFormat = OutputOption,
) -> None:
    """Launch a pass-rate job: every task of the split sampled N times; the controller records the rates."""
    from controller.pass_rate import launch_pass_rate_job

    def launch_job(session: Session) -> dict[str, Any]:
        run = launch_pass_rate_job(session, environment=environment, samples_per_task=samples, model=model,
                                   split=split, success_threshold=threshold, component=component)
        return describe_run(session, run, detail=True)

    _show([_in_session(launch_job)], output, single=True)


def _archive_command(action: Callable[..., Any], run_id: int, output: OutputFormat) -> None:
    from core.db import get_engine

    with readable_errors():
        report = asdict(action(get_engine(), run_id))
    if output is OutputFormat.json:
        print_json(report)
        return
    console.print(f"run {report['run_id']}: {report['turns']} turns of {report['episodes']} episodes, "
                  f"{report['bytes'] / 2**20:.1f} MiB of Parquet ({safe(report['path'])}), "
                  f"{report['seconds']:.1f} s", highlight=False)


@runs_app.command()
def archive(run_id: int = typer.Argument(..., help="Run id (a finished run)."),
            output: OutputFormat = OutputOption) -> None:
    """Move a finished run's turns out of Postgres into Parquet under CRUCIBLE_ARCHIVE_DIR; the API and
    dashboard still show them (full-text search of its turns ends until it is restored)."""
    from core.archive import archive_run

    _archive_command(archive_run, run_id, output)


@runs_app.command("points")
def points(run_id: int | None = typer.Argument(None, help="Run id; every run when left out."),
           output: OutputFormat = OutputOption) -> None:
    """Store the run-page point of every training step that has none (steps recorded before the trainer
    kept them, migration 0008), so the run page stops computing them from the episodes on every view."""
    from core.step_points import backfill_points

    def fill(session: Session) -> dict[int, int]:
        if run_id is not None:
            get_run(session, run_id=run_id)  # an unknown run is an error, not "nothing to do"
        filled = backfill_points(session, run_id=run_id)
        session.commit()
        return filled

    filled = _in_session(fill)
    if output is OutputFormat.json:
        print_json({"steps_filled": {str(run): count for run, count in filled.items()}})
        return
    for run, count in filled.items():
        console.print(f"run {run}: {count} steps given their stored point", highlight=False)
    if not filled:
        console.print("every training step already has its stored point", highlight=False)


@runs_app.command()
def restore(run_id: int = typer.Argument(..., help="Run id (an archived run)."),
            output: OutputFormat = OutputOption) -> None:
    """Put an archived run's turns back into Postgres (checked against the archive's SHA-256) and remove
    the archive."""
    from core.archive import restore_run

    _archive_command(restore_run, run_id, output)
