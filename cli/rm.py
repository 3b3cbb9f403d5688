"""`crucible rm train`: fit a Bradley–Terry reward model from preference pairs and report how well it
ranks pairs it never saw.

    python -m trainer.synthetic_preferences prefs.jsonl --pairs 1000 --seed 0
    crucible model init-tiny tiny
    crucible rm train --pairs prefs.jsonl --model tiny --out rm --epochs 8 -o json
    crucible rm train --run 7 --model tiny --out rm     # pairs mined from run 7's groups
    crucible rm serve rm --port 8002                     # POST /v1/score, for the reward_model layer

Heavy imports (torch, transformers) happen inside the command, so `crucible --help` stays fast.
Threads: torch uses every core unless OMP_NUM_THREADS says otherwise.
"""

from __future__ import annotations

import sys
from contextlib import redirect_stdout
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors, safe

if TYPE_CHECKING:
    from trainer.preference_pairs import PreferencePair

app = typer.Typer(help="Preference reward models.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Preference reward models."""  # a callback keeps `rm` a command group even with one command


def _load_pairs(*, pairs: Path | None, run: int | None) -> list[PreferencePair]:
    from core.errors import ConfigError
    from trainer.preference_pairs import load_pairs_jsonl

    if pairs is not None and run is None:
        return load_pairs_jsonl(pairs)
    if run is not None and pairs is None:
        from core.db import session_scope
        from trainer.preference_mining import mine_pairs

        with session_scope() as session:
            return mine_pairs(session, run_id=run)
    raise ConfigError("expected exactly one of --pairs FILE or --run ID, got "
                      + ("both" if pairs is not None else "neither"))


@app.command("train")
def train(
    pairs: Path | None = typer.Option(None, "--pairs", help='JSONL, one {"prompt", "chosen", "rejected"} a line.'),
    run: int | None = typer.Option(None, "--run", help="Or mine a run's groups: best vs worst episode of each."),
    model: Path = typer.Option(..., "--model", help="A local causal LM directory; its trunk is the reward model's."),
    out: Path = typer.Option(..., "--out", help="Where to write the reward model (new or empty)."),
    epochs: int = typer.Option(3, "--epochs", help="Passes over the training pairs."),
    lr: float = typer.Option(1e-3, "--lr", help="AdamW learning rate."),
    seed: int = typer.Option(0, "--seed", help="Seeds the split, the batch order and the head's init."),
    held_out: float = typer.Option(0.2, "--held-out", help="Share of pairs kept out of training, to measure."),
    batch_size: int = typer.Option(16, "--batch-size", help="Pairs per optimizer step."),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Longest rendered prompt + response (tail kept)."),
    output: OutputFormat = OutputOption,
) -> None:
    """Fit R(prompt, response) so that R(chosen) > R(rejected); print held-out pairwise accuracy."""
    # Libraries print to stdout (DeepSpeed's accelerator notice, imported through transformers): during
    # the work stdout is stderr, so `-o json` prints JSON and nothing else.
    with readable_errors(), redirect_stdout(sys.stderr):
        from trainer.preference_pairs import check_fit_options, split_pairs

        # Bad input is refused before torch and the model load (seconds): the pairs, the options, the split.
        loaded = _load_pairs(pairs=pairs, run=run)
        check_fit_options(epochs=epochs, lr=lr, batch_size=batch_size, max_tokens=max_tokens, out_dir=out)
        split_pairs(loaded, held_out=held_out, seed=seed)

        from transformers.utils import logging as hf_logging

        from trainer.reward_model import train_reward_model

        hf_logging.disable_progress_bar()
        report = train_reward_model(pairs=loaded, model_dir=model, out_dir=out, epochs=epochs, lr=lr, seed=seed,
                                    held_out=held_out, batch_size=batch_size, max_tokens=max_tokens)
    if output == OutputFormat.json:
        print_json(asdict(report))
        return
    correct = round(report.held_out_accuracy * report.held_out_pairs)
    console.print(
        f"[green]reward model[/] {safe(report.out_dir)}: held-out pairwise accuracy "
        f"{report.held_out_accuracy:.3f} ({correct}/{report.held_out_pairs} pairs), held-out loss "
        f"{report.held_out_loss:.4f}\ntrained on {report.train_pairs} pairs: {report.epochs} epochs, "
        f"{report.steps} steps, loss {report.first_train_loss:.4f} → {report.last_train_loss:.4f}, "
        f"{report.seconds:.1f} s", highlight=False,
    )


@app.command("serve")
def serve(
    reward_model: Path = typer.Argument(..., help="A directory `crucible rm train` wrote."),
    port: int = typer.Option(8002, min=1, max=65535, help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
) -> None:
    """Serve a reward model: POST /v1/score scores (prompt, response) items for the reward_model layer."""
    from api.reward_model_server import create_app
    from api.server import listening_socket, serve

    with readable_errors():
        listening_socket(host=host, port=port).close()  # a port in use: one line before the model loads
        app = create_app(reward_model)
    console.print(f"[green]serving[/] reward model {safe(str(reward_model))} at http://{host}:{port}/v1/score "
                  "(bearer tokens of this store: `crucible token create NAME`); Ctrl-C stops it")
    with readable_errors():
        serve(host=host, port=port, app=app)
