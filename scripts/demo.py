"""`make demo`: watch a tiny model learn a multi-turn tool task with real RL on this machine.

    scripts/demo.sh                                  # = .venv/bin/python scripts/demo.py
    .venv/bin/python scripts/demo.py --rl-minutes 5 --seed 0

On the embedded default (no CRUCIBLE_DATABASE_URL: embedded Postgres, Celery on its SQLAlchemy
transport): builds the sandbox images (`crucible images build`), makes a tiny model (`crucible model
init-tiny`), warms it up with a short SFT on synthetic demonstrations, then runs real RL — controller
+ task worker (Docker sandboxes) + trainer + vLLM on CPU — on the `read_number` environment (read a
file, submit the number it holds), printing a live view of the steps and the held-out success rate
before and after. The runs stay in the store (`crucible run ls`); the numbers and the curve are
written to <workdir>/result.json. The steps themselves live in `cli/demo.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer

from cli.console import console, readable_errors
from cli.demo import (
    ENV_NAME,
    QUIET,
    DemoSettings,
    Processes,
    evaluate,
    launch_training,
    prepare,
    register,
    warm_up,
    watch_training,
)


def _single_demo() -> Any:
    """An exclusive lock on <data dir>/demo.lock for this process's life; ConfigError if another holds it
    (two demos would share the broker's queue and run each other's episodes)."""
    import fcntl

    from core.errors import ConfigError
    from core.settings import get_settings

    path = get_settings().data_dir / "demo.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        raise ConfigError(f"another demo is running (pid {handle.read().strip() or '?'}, lock {path}); "
                          "wait for it to finish") from None
    handle.truncate(0)
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def demo(
    rl_minutes: float = typer.Option(5.0, help="Wall-clock budget of the RL phase."),
    sft_steps: int = typer.Option(1000, help="Most warm-up steps (they stop once the model copies numbers)."),
    seed: int = typer.Option(0, help="Seed of the model, the tasks and the runs."),
    workdir: Path | None = typer.Option(None, help="Default: <data dir>/demo/<timestamp>."),
) -> None:
    """Watch a tiny model learn a multi-turn tool task with real RL (under 15 minutes on 2 cores)."""
    for name, value in QUIET.items():  # for this process and every one it starts
        os.environ.setdefault(name, value)
    settings = DemoSettings(rl_minutes=rl_minutes, sft_steps=sft_steps, seed=seed, workdir=workdir)
    with readable_errors():
        lock = _single_demo()
    began = time.monotonic()
    path = prepare(settings, console=console)
    warm = warm_up(settings, workdir=path, console=console)
    counts = register(settings)
    console.print(f"  tasks: {counts['train']} train, {counts['test']} held-out ({ENV_NAME})")
    served = Path(shutil.copytree(warm, path / "served", dirs_exist_ok=True))  # vLLM's copy: syncs rewrite it
    (path / "logs").mkdir(exist_ok=True)
    with Processes(workdir=path, served_dir=served, console=console) as procs:
        before = evaluate(procs, settings=settings, model=str(served), label="before", console=console)
        run_id = launch_training(procs, settings=settings, model=str(warm))
        curve = watch_training(procs, run_id=run_id, minutes=settings.rl_minutes, console=console)
        after = evaluate(procs, settings=settings, model=str(served), label="after", console=console)
    result = {"run_id": run_id, "held_out_success_before": before, "held_out_success_after": after,
              "delta_points": round(100 * (after - before), 1), "minutes": round((time.monotonic() - began) / 60, 1),
              "curve": curve}
    (path / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    lock.close()
    console.print(f"\n[bold]held-out success: {before:.0%} → {after:.0%} ({result['delta_points']:+.1f} points)[/] "
                  f"in {result['minutes']} min. Run {run_id} stays in the store (`crucible run show {run_id}`); "
                  f"curve and numbers in {path / 'result.json'}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the demo like Ctrl-C: every process it started is stopped


if __name__ == "__main__":
    import logging
    import signal

    signal.signal(signal.SIGTERM, _interrupt)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(demo)
