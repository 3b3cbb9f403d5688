"""`crucible trainer --run ID`: train a run's policy from its complete groups, pushing every new
version to the vLLM servers the workers sample from.

    crucible serve /data/served --port 8000 &            # the policy server (a copy of the run's model)
    crucible trainer --run 7 --policy-url http://127.0.0.1:8000/v1 --policy-dir /data/served

    # a pool: CRUCIBLE_POLICY_URLS=http://h0:8000/v1,http://h1:8000/v1, each replica its own copy
    crucible trainer --run 7 --policy-dir /data/served-0 --policy-dir /data/served-1

    # several ranks sharding the model with DeepSpeed ZeRO (the run's config.trainer.deepspeed): torchrun
    # starts N processes; rank 0 claims each batch and leads, every rank trains its share of it
    crucible trainer --run 7 --nproc 2 --restarts 3

Also runnable without the root CLI: `python -m cli.trainer --run 7 …`. Stops on Ctrl-C/SIGTERM
between steps (a step in progress is abandoned and retrained after a restart, never lost). With
several ranks, a rank that dies (even by SIGKILL) ends them all (torchrun); they are started again up
to `--restarts` times and resume from the last checkpoint: the step in progress was never
committed, so its groups are claimed again, none lost and none trained twice.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from cli.console import console, readable_errors

if TYPE_CHECKING:
    from trainer.loop import Trainer
    from trainer.sync import Publisher


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


def build_publisher(*, model: str, policy_urls: list[str], policy_dirs: list[Path],
                    fallback_dir: Path | None = None) -> Publisher:
    """What pushes `model`'s weights (the trainer's, or a checkpoint's) to every policy replica in
    `policy_urls`, each serving its own directory (`replica_dirs`)."""
    from transformers import AutoTokenizer

    from trainer.probe import probe_token_ids
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
    return Publisher(replicas=replicas, probe_ids=probe_token_ids(AutoTokenizer.from_pretrained(model)))


def build_trainer(
    *, run_id: int, policy_urls: list[str] | None, policy_dirs: list[Path], fallback_dir: Path | None = None,
    checkpoint_dir: Path | None, poll: float,
) -> Trainer:
    """The Trainer for `run_id`, wired to every policy replica in `policy_urls` (None: the run's pool,
    core.schemas.run.StoredRun.pool) by `build_publisher`. PoolHeld (trainer.loop.Trainer) when a live
    trainer of another run holds one of them (core.pools)."""
    from core.db import session_scope
    from core.schemas.run import stored_run
    from core.settings import get_settings
    from trainer.loop import Trainer
    from trainer.store import get_run

    with session_scope() as session:
        run = get_run(session, run_id=run_id)
        model = run.model
        policy_urls = policy_urls or stored_run(run.config, run_id=run_id).pool
    publisher = build_publisher(model=model, policy_urls=policy_urls, policy_dirs=policy_dirs,
                                fallback_dir=fallback_dir)
    root = checkpoint_dir or get_settings().data_dir / "checkpoints" / f"run-{run_id}"
    return Trainer(run_id=run_id, publisher=publisher, checkpoint_root=root, poll_s=poll)


def trainer(
    run: int = typer.Option(..., "--run", "--run-id", help="Run id."),
    policy_url: str | None = typer.Option(
        None, help="One vLLM OpenAI API root; default the run's pool (its policy_urls, else every replica of "
        "CRUCIBLE_POLICY_URLS, else CRUCIBLE_POLICY_URL)."),
    policy_dir: list[Path] | None = typer.Option(
        None, help="The model directory each server loaded (rewritten on every sync), once per replica in "
        "CRUCIBLE_POLICY_URLS order; default CRUCIBLE_POLICY_TOKENIZER for one server, else the directory "
        "each server reports."),
    checkpoint_dir: Path | None = typer.Option(None, help="Default: <data dir>/checkpoints/run-<id>."),
    poll: float = typer.Option(1.0, min=0.05, help="Seconds between looks for a ready batch."),
    max_steps: int | None = typer.Option(None, min=1, help="Stop after this many steps (default: when the run ends)."),
    nproc: int = typer.Option(1, min=1, max=64, help="Trainer ranks on this host (torchrun); >1 needs "
                              "the run's config.trainer.deepspeed."),
    restarts: int = typer.Option(0, min=0, max=100, help="With --nproc > 1: times every rank is started again "
                                 "after one died (they resume from the last checkpoint)."),
) -> None:
    """Train a run: claim complete groups, update the policy, sync every vLLM replica, publish versions."""
    from core.settings import get_settings

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) != 0:
        _follow()  # a follower rank under torchrun: no database, no policy servers
        return
    if nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:  # not yet under torchrun
        with readable_errors():
            _check_ranks(run)
        # torchrun's argument parser reads its script's options too and refuses any that abbreviates
        # one of its own (--run: --run-path; --nproc: --nproc-per-node): these spellings abbreviate none.
        args = ["--run-id", str(run), "--poll", str(poll)]
        args += ["--policy-url", policy_url] if policy_url else []
        args += [item for directory in policy_dir or [] for item in ("--policy-dir", str(directory))]
        args += ["--checkpoint-dir", str(checkpoint_dir)] if checkpoint_dir else []
        args += ["--max-steps", str(max_steps)] if max_steps else []
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   "-m", "cli.trainer", *args]
        raise typer.Exit(_launch_ranks(command, nproc=nproc, restarts=restarts))

    settings = get_settings()
    with readable_errors():
        loop = build_trainer(run_id=run, policy_urls=[policy_url] if policy_url else None,
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


def _check_ranks(run_id: int) -> None:
    """Several ranks shard the model with DeepSpeed ZeRO: the run must say so (clear error, before any launch)."""
    from core.db import session_scope
    from core.errors import ConfigError
    from core.schemas.run import stored_run
    from trainer.store import get_run

    with session_scope() as session:
        run = get_run(session, run_id=run_id)
        config = stored_run(run.config, run_id=run_id).trainer
    if config.deepspeed is None:
        raise ConfigError(f"--nproc: several trainer ranks shard the model with DeepSpeed ZeRO: expected run "
                          f"{run_id}'s config.trainer.deepspeed (e.g. {{stage: 3}}), got none")


def _launch_ranks(command: list[str], *, nproc: int, restarts: int) -> int:
    """Run torchrun; when a rank dies (torchrun then ends them all), run it again, up to `restarts` times:
    the ranks resume from the last checkpoint. Each attempt is a fresh torchrun (a fresh rendezvous:
    torchrun's own restarts reuse its store, and gloo would dial the dead rank's old address). SIGTERM
    and SIGINT go to the running attempt and end the restarts."""
    import subprocess

    from trainer.faults import ATTEMPT_ENV

    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def _forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    for attempt in range(restarts + 1):
        console.print(f"starting {nproc} trainer ranks (attempt {attempt + 1} of {restarts + 1}): "
                      f"{' '.join(command[1:])}", highlight=False)
        child = subprocess.Popen(command, env={**os.environ, ATTEMPT_ENV: str(attempt)})
        code = child.wait()
        if code == 0 or stopping:
            return code
        console.print(f"[yellow]trainer ranks exited with {code}[/]", highlight=False)
    return code


def _follow() -> None:
    from trainer.engine_deepspeed import join_process_group
    from trainer.loop import build_follower
    from trainer.ranks import follow

    join_process_group()
    follow(build=build_follower)


if __name__ == "__main__":
    import logging

    from core import redact
    from core.settings import get_settings

    logging.basicConfig(level=get_settings().log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    redact.install(redact.settings_secrets())
    typer.run(trainer)
