"""`crucible trainer --run ID`: train a run's policy from its complete groups, pushing every new
version to the vLLM servers the workers sample from.

    crucible serve /data/served --port 8000 &            # the policy server (a copy of the run's model)
    crucible trainer --run 7 --policy-url http://127.0.0.1:8000/v1 --policy-dir /data/served

    # a pool: CRUCIBLE_POLICY_URLS=http://h0:8000/v1,http://h1:8000/v1, each replica its own copy
    crucible trainer --run 7 --policy-dir /data/served-0 --policy-dir /data/served-1

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


def _served_model(api_url: str) -> tuple[str, str | None]:
    """The model a vLLM server serves: its name and `root` (the directory it loaded, as vLLM saw it)."""
    import httpx

    from core.errors import ServiceUnavailable

    try:
        response = httpx.get(f"{api_url.rstrip('/')}/models", timeout=10)
        response.raise_for_status()
        card = response.json()["data"][0]
        return str(card["id"]), None if card.get("root") is None else str(card["root"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
        raise ServiceUnavailable(f"policy server: expected a vLLM server at {api_url}, got {error!r}") from None


def replica_dirs(*, urls: list[str], given: list[Path], fallback: Path | None, roots: list[str | None]) -> list[Path]:
    """The model directory of each replica, in `urls` order: `given` (one per replica), else — one
    server — `fallback` (CRUCIBLE_POLICY_TOKENIZER), else the `root` each server reports, which must be a
    model directory on this host. The reload path rewrites a replica's directory, so no two may share one."""
    from core.errors import ConfigError

    if given and len(given) != len(urls):
        raise ConfigError(f"--policy-dir: expected one served model directory per policy replica ({len(urls)}, "
                          f"in CRUCIBLE_POLICY_URLS order), got {len(given)}")
    if given:
        dirs = list(given)
    elif len(urls) == 1 and fallback is not None:
        dirs = [fallback]
    else:
        dirs = []
        for url, root in zip(urls, roots, strict=True):
            if not _is_model_dir(root):
                raise ConfigError(f"--policy-dir: expected the served model directory of {url} (it reports "
                                  f"{(root or '')[:200]!r}, not a model directory on this host); pass one --policy-dir per replica")
            dirs.append(Path(str(root)))
    seen: dict[Path, str] = {}
    for url, directory in zip(urls, dirs, strict=True):
        resolved = directory.resolve()
        if resolved in seen:
            raise ConfigError(f"--policy-dir: expected one model directory per replica (weight sync rewrites it), "
                              f"got {resolved} for both {seen[resolved]} and {url}")
        seen[resolved] = url
    return dirs


def _is_model_dir(root: str | None) -> bool:
    try:
        return root is not None and (Path(root) / "config.json").is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte: not a directory here either
        return False


def build_trainer(
    *, run_id: int, policy_urls: list[str], policy_dirs: list[Path], fallback_dir: Path | None = None,
    checkpoint_dir: Path | None, poll: float,
) -> Trainer:
    """The Trainer for `run_id`, wired to every policy replica in `policy_urls` (each serving its own
    directory: `replica_dirs`)."""
    from transformers import AutoTokenizer

    from core.db import session_scope
    from core.settings import get_settings
    from trainer.loop import Trainer
    from trainer.probe import probe_token_ids
    from trainer.store import get_run
    from trainer.sync import PolicyServer, Publisher, Replica
    from trainer.weight_sync import make_weight_syncer

    api_urls = [url.rstrip("/") for url in policy_urls]
    served = [_served_model(url) for url in api_urls]
    dirs = replica_dirs(urls=api_urls, given=policy_dirs, fallback=fallback_dir, roots=[root for _, root in served])
    replicas = []
    for api_url, (name, _), directory in zip(api_urls, served, dirs, strict=True):
        base_url = api_url.removesuffix("/v1")
        server = PolicyServer(api_url=api_url, base_url=base_url, model_name=name, model_dir=directory)
        replicas.append(Replica(server=server, syncer=make_weight_syncer("reload", base_url=base_url,
                                                                          model_dir=directory)))
    with session_scope() as session:
        model = get_run(session, run_id=run_id).model
    probe_ids = probe_token_ids(AutoTokenizer.from_pretrained(model))
    publisher = Publisher(replicas=replicas, probe_ids=probe_ids)
    root = checkpoint_dir or get_settings().data_dir / "checkpoints" / f"run-{run_id}"
    return Trainer(run_id=run_id, publisher=publisher, checkpoint_root=root, poll_s=poll)


def trainer(
    run: int = typer.Option(..., "--run", help="Run id."),
    policy_url: str | None = typer.Option(
        None, help="One vLLM OpenAI API root; default every replica of CRUCIBLE_POLICY_URLS (else CRUCIBLE_POLICY_URL)."),
    policy_dir: list[Path] | None = typer.Option(
        None, help="The model directory each server loaded (rewritten on every sync), once per replica in "
        "CRUCIBLE_POLICY_URLS order; default CRUCIBLE_POLICY_TOKENIZER for one server, else the directory "
        "each server reports."),
    checkpoint_dir: Path | None = typer.Option(None, help="Default: <data dir>/checkpoints/run-<id>."),
    poll: float = typer.Option(1.0, min=0.05, help="Seconds between looks for a ready batch."),
    max_steps: int | None = typer.Option(None, min=1, help="Stop after this many steps (default: when the run ends)."),
) -> None:
    """Train a run: claim complete groups, update the policy, sync every vLLM replica, publish versions."""
    from core.settings import get_settings

    settings = get_settings()
    with readable_errors():
        loop = build_trainer(run_id=run, policy_urls=[policy_url] if policy_url else settings.policy_pool,
                             policy_dirs=list(policy_dir or []), fallback_dir=settings.policy_tokenizer,
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
