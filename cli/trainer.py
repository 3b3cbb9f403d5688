"""`crucible trainer --run ID`: train a run's policy from its complete groups, pushing every new
version to the vLLM server the workers sample from.

    crucible serve /data/served --port 8000 &            # the policy server (a copy of the run's model)
    crucible trainer --run 7 --policy-url http://127.0.0.1:8000/v1 --policy-dir /data/served

Also runnable without the root CLI: `python -m cli.trainer --run 7 …`. Stops on Ctrl-C/SIGTERM
between steps (a step in progress is abandoned and retrained after a restart, never lost).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from cli.console import console, readable_errors

if TYPE_CHECKING:
    from trainer.loop import Trainer


def _served_model_name(api_url: str) -> str:
    import httpx

    from core.errors import ServiceUnavailable

    try:
        response = httpx.get(f"{api_url.rstrip('/')}/models", timeout=10)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError) as error:
        raise ServiceUnavailable(f"policy server: expected a vLLM server at {api_url}, got {error!r}") from None


def build_trainer(
    *, run_id: int, policy_url: str, policy_dir: Path, checkpoint_dir: Path | None, poll: float
) -> Trainer:
    """The Trainer for `run_id`, wired to the policy server at `policy_url` serving `policy_dir`."""
    from transformers import AutoTokenizer

    from core.settings import get_settings
    from trainer.loop import Trainer
    from trainer.probe import probe_token_ids
    from trainer.store import get_run
    from trainer.sync import PolicyServer, Publisher
    from trainer.weight_sync import make_weight_syncer

    api_url = policy_url.rstrip("/")
    base_url = api_url.removesuffix("/v1")
    server = PolicyServer(api_url=api_url, base_url=base_url, model_name=_served_model_name(api_url),
                          model_dir=policy_dir)
    from core.db import session_scope

    with session_scope() as session:
        model = get_run(session, run_id=run_id).model
    probe_ids = probe_token_ids(AutoTokenizer.from_pretrained(model))
    syncer = make_weight_syncer("reload", base_url=base_url, model_dir=policy_dir)
    publisher = Publisher(server=server, syncer=syncer, probe_ids=probe_ids)
    root = checkpoint_dir or get_settings().data_dir / "checkpoints" / f"run-{run_id}"
    return Trainer(run_id=run_id, publisher=publisher, checkpoint_root=root, poll_s=poll)


def trainer(
    run: int = typer.Option(..., "--run", help="Run id."),
    policy_url: str | None = typer.Option(None, help="vLLM OpenAI API root; default CRUCIBLE_POLICY_URL."),
    policy_dir: Path | None = typer.Option(
        None, help="The model directory the server loaded (rewritten on every sync); default CRUCIBLE_POLICY_TOKENIZER."),
    checkpoint_dir: Path | None = typer.Option(None, help="Default: <data dir>/checkpoints/run-<id>."),
    poll: float = typer.Option(1.0, min=0.05, help="Seconds between looks for a ready batch."),
    max_steps: int | None = typer.Option(None, min=1, help="Stop after this many steps (default: when the run ends)."),
) -> None:
    """Train a run: claim complete groups, update the policy, sync vLLM, publish versions."""
    from core.errors import ConfigError
    from core.settings import get_settings

    settings = get_settings()
    directory = policy_dir or settings.policy_tokenizer
    with readable_errors():
        if directory is None:
            raise ConfigError("--policy-dir: expected the served model directory (or CRUCIBLE_POLICY_TOKENIZER)")
        loop = build_trainer(run_id=run, policy_url=policy_url or settings.policy_url, policy_dir=Path(directory),
                             checkpoint_dir=checkpoint_dir, poll=poll)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    console.print(f"training run {run}; checkpoints in {loop.checkpoints.root}", highlight=False)
    try:
        with readable_errors():
            steps = loop.run(max_steps=max_steps, stop=stop)
    finally:
        loop.close()
    console.print(f"[green]done[/]: {steps} steps this session, at step {loop.step}", highlight=False)


if __name__ == "__main__":
    import logging

    from core.settings import get_settings

    logging.basicConfig(level=get_settings().log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(trainer)
