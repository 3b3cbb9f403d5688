"""A recipe's learning stages, after its warm-up: `evaluate` (a held-out eval run) → `launch_training` (a
train run and its trainer) → `watch_training` (the live view, step by step) → `evaluate` again; `learn`
runs them in that order and returns what they measured (`Learned`, whose `figures` open every recipe's
result.json). The processes they drive are recipes.common.Processes.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import select

from recipes.common import Processes, RecipeSettings, sized, stage


def _wait_run(run_id: int, *, procs: Processes, stall_s: float) -> None:
    """Until the run completes; TimeoutError once `stall_s` pass with no episode of it stored (a loaded
    machine, or a larger model, does the same work slower: only a run that stopped moving is given up)."""
    from sqlalchemy import func

    from core.db import session_scope
    from core.models import Episode, Run

    stored, deadline = -1, time.monotonic() + stall_s
    while time.monotonic() < deadline:
        with session_scope() as session:
            if session.get(Run, run_id).status == "completed":  # type: ignore[union-attr]
                return
            count = session.execute(select(func.count()).where(Episode.run_id == run_id)).scalar_one()
        if count > stored:
            stored, deadline = count, time.monotonic() + stall_s
        procs.check_alive()
        time.sleep(1.0)
    raise TimeoutError(f"run {run_id} stored no episode for {stall_s:.0f} s ({max(stored, 0)} stored)")


@dataclass(frozen=True)
class Held:
    """A held-out evaluation's pass@1 (`crucible eval`'s report: the mean over tasks) and its 95 % interval."""

    run_id: int
    success: float
    low: float
    high: float
    episodes: int

    def interval(self) -> list[float]:
        return [round(self.low, 4), round(self.high, 4)]


def evaluate(procs: Processes, *, settings: RecipeSettings, model: str, label: str, console: Console,
             environment: str, prefix: str, samples: int | None = None) -> Held:
    """An eval run over every held-out task (`samples`, default `eval_samples`, episodes each:
    controller.evaluation.launch_eval),
    through controller and worker; its report is api.services.run_eval's, as `crucible eval show` prints it."""
    from api.services.run_eval import eval_report
    from controller.evaluation import launch_eval
    from core.db import session_scope

    started = stage(console, f"held-out evaluation ({label})")
    with session_scope() as session:
        run_id = launch_eval(session, model=model, environment=environment, samples_per_task=samples or settings.eval_samples,
                             seed=settings.seed, name=f"{prefix}-eval-{label}-{time.strftime('%H%M%S')}",
                             max_inflight_groups=8).id
    _wait_run(run_id, procs=procs, stall_s=600)
    with session_scope() as session:
        overall = eval_report(session, run_id=run_id).overall
    rate = overall.pass_at_1
    held = Held(run_id=run_id, success=rate.value if rate else 0.0, low=rate.low if rate else 0.0,
                high=rate.high if rate else 0.0, episodes=overall.episodes)
    console.print(f"  [bold]{label}: {held.success:.0%}[/] [95 % interval {held.low:.0%}–{held.high:.0%}, tasks "
                  f"resampled] of {held.episodes} episodes (run {run_id}, {time.monotonic() - started:.0f} s; "
                  f"`crucible eval show {run_id}`)")
    return held


@dataclass(frozen=True)
class Learned:
    """What `learn` measured: the held-out evaluations before and after, the train run and its curve."""

    before: Held
    after: Held
    run_id: int
    curve: list[dict[str, Any]]
    raw: Held | None = None
    """The model as imported, before any warm-up (recipes on a pretrained model); None for the tiny model,
    whose raw weights are random."""

    def figures(self) -> dict[str, Any]:
        """The figures every recipe's result.json opens with."""
        evals = [self.before.run_id, self.after.run_id] if self.raw is None else [
            self.raw.run_id, self.before.run_id, self.after.run_id]
        figures: dict[str, Any] = {"run_id": self.run_id, "eval_run_ids": evals,
                   "held_out_success_before": self.before.success, "held_out_success_after": self.after.success,
                   "held_out_interval_before": self.before.interval(),
                   "held_out_interval_after": self.after.interval(),
                   "delta_points": round(100 * (self.after.success - self.before.success), 1)}
        if self.raw is not None:
            figures.update(held_out_success_raw=self.raw.success, held_out_interval_raw=self.raw.interval())
        return figures


def learn(settings: RecipeSettings, *, path: Path, warm: Path, environment: str, prefix: str, console: Console,
          queues: str = "celery,read_number", max_model_len: int = 1024) -> Learned:
    """After a recipe's warm-up: vLLM serving a copy of the warmed-up model (`path/served`, the trainer
    pushes new weights into it), the worker and the controller; a held-out evaluation, RL for the
    settings' budget, a held-out evaluation again. On a pretrained model (`settings.model`), first a
    held-out evaluation of the model as imported: what the warm-up and RL each add."""
    import shutil

    served = path / "served"
    shutil.copytree(warm, served, dirs_exist_ok=True)
    (path / "logs").mkdir(exist_ok=True)

    def processes(served_dir: Path, serving: str) -> Processes:
        return Processes(workdir=path, served_dir=served_dir, console=console, serving=serving,
                         episodes_at_once=settings.episodes_at_once,
                         startup_timeout_s=settings.vllm_startup_s, max_model_len=max_model_len, queues=queues,
                         sizing=sized(settings, path, max_model_len=max_model_len))

    raw = None
    if settings.model is not None:
        with processes(settings.model, "the model as imported (no warm-up)") as procs:
            raw = evaluate(procs, settings=settings, model=str(settings.model), label="raw", console=console,
                           environment=environment, prefix=prefix, samples=settings.raw_eval_samples)
    with processes(served, "the warmed-up model") as procs:
        def held_out(label: str) -> Held:
            return evaluate(procs, settings=settings, model=str(served), label=label, console=console,
                            environment=environment, prefix=prefix)

        before = held_out("before")
        run_id = launch_training(procs, settings=settings, model=str(warm), environment=environment, prefix=prefix)
        curve = watch_training(procs, run_id=run_id, minutes=settings.rl_minutes, console=console,
                               max_steps=settings.rl_steps)
        after = held_out("after")
    return Learned(before=before, after=after, run_id=run_id, curve=curve, raw=raw)


def launch_training(procs: Processes, *, settings: RecipeSettings, model: str, environment: str | list[str],
                    prefix: str) -> int:
    """The train run (async GRPO) over one environment or several, and its trainer process (its
    micro-batch, activation checkpointing and served dtype those of `procs.sizing`)."""
    from controller.runs import create_run
    from core.db import session_scope
    from core.schemas import RunConfig

    config = RunConfig.model_validate({
        "name": f"{prefix}-train-{time.strftime('%Y%m%d-%H%M%S')}", "model": model,
        "environments": [{"name": name} for name in ([environment] if isinstance(environment, str) else environment)],
        "split": "train", "group_size": settings.group_size, "batch_size": settings.batch_size, "mode": "async",
        "max_staleness": 1, "seed": settings.seed,
        "trainer": {"optimizer": {"lr": settings.lr}} if procs.sizing is None else procs.sizing.trainer_config(lr=settings.lr),
        "sampling": {"temperature": settings.train_temperature}})
    with session_scope() as session:
        run_id = create_run(session, config=config).id
    server = procs.server
    procs.spawn("trainer", [sys.executable, "-m", "cli.trainer", "--run", str(run_id), "--policy-url", server.api_url,
                            "--policy-dir", str(procs.served_dir), "--checkpoint-dir",
                            str(procs.workdir / "checkpoints"), "--poll", "0.3"])
    return run_id


def _step_rows(run_id: int, after: int) -> list[tuple[int, dict[str, Any]]]:
    from core.db import session_scope
    from core.models import TrainingStep

    with session_scope() as session:
        rows = session.execute(select(TrainingStep.step, TrainingStep.metrics)
                               .where(TrainingStep.run_id == run_id, TrainingStep.step > after)
                               .order_by(TrainingStep.step)).all()
    return [(step, dict(values)) for step, values in rows]


def watch_training(procs: Processes, *, run_id: int, minutes: float, console: Console,
                   max_steps: int | None = None) -> list[dict[str, Any]]:
    """Print each step as it lands until the budget (minutes, or `max_steps` steps) is spent; then stop
    the run and the trainer."""
    from controller.runs import stop_run
    from core.db import session_scope

    started = stage(console, f"RL: run {run_id}, {minutes:g} min budget (controller + worker + trainer + vLLM)")
    console.print("  step  success  reward  groups  dropped  mismatch_kl  tok/s   sync_s  elapsed")
    curve: list[dict[str, Any]] = []
    last = 0
    while time.monotonic() - started < minutes * 60 and (max_steps is None or len(curve) < max_steps):
        procs.check_alive()
        if procs.children["trainer"].poll() is not None:
            raise RuntimeError(f"the trainer exited early; see {procs.workdir}/logs/trainer.log")
        for step, m in _step_rows(run_id, last):
            last = step
            elapsed = time.monotonic() - started
            point = {"step": step, "success": m.get("reward/success_frac"), "reward": m.get("reward/mean"),
                     "elapsed_s": round(elapsed, 1)}
            curve.append(point)
            console.print(f"  {step:>4}  {_pct(point['success'])}  {_num(point['reward'])}  "
                          f"{_num(m.get('batch/groups'), 0):>6}  {_dropped(m):>7}  "
                          f"{_num(m.get('mismatch/kl'), 6):>11}  {_num(m.get('throughput/tokens_per_s'), 0):>5}  "
                          f"{_num(m.get('sync/seconds'), 3):>6}  {elapsed:>5.0f}s")
        time.sleep(2.0)
    with session_scope() as session:
        stop_run(session, run_id=run_id)
    code = procs.stop("trainer", grace_s=120)
    console.print(f"  run {run_id} stopped after {len(curve)} steps (trainer exit {code})")
    return curve


def _dropped(metrics: dict[str, Any]) -> str:
    """The step's dropped groups, every reason together (batch/dropped/{reason})."""
    return str(int(sum(v for k, v in metrics.items() if k.startswith("batch/dropped/") and isinstance(v, int | float))))


def drop_reasons(run_id: int) -> dict[str, int]:
    """The run's dropped groups by reason, as stored on each group (core.termination.DropReason)."""
    from controller.progress import run_progress
    from core.db import session_scope

    with session_scope() as session:
        return run_progress(session, run_id=run_id).drop_reasons


def _pct(value: Any) -> str:
    return f"{value:>6.0%} " if isinstance(value, int | float) else "     - "


def _num(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"
