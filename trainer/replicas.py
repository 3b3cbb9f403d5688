"""A local pool of vLLM replicas (`crucible serve DIR --replicas N`): `replica_plan` gives each replica a
port, an equal share of this process's cores and a copy of the model directory of its own
(`copy_model_dir`: the directory a server reads); `start_all` launches them together and stops them all
if one fails; `wait_first_exit` watches them. One replica is a trainer.serving.VllmServer.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from core.errors import ConfigError
from core.net import free_port
from trainer.errors import ServerStartError
from trainer.serving import VllmServer


@dataclass(frozen=True)
class ReplicaPlan:
    """One local replica of a pool: where it listens, the cores it runs on, the copy it serves."""

    index: int
    port: int
    cpus: tuple[int, ...]
    model_dir: Path
    model_name: str
    """The same for every replica (workers send one name): the original directory, resolved, by default."""


def replica_plan(
    *, model_dir: Path, replicas: int, port: int, host: str = "127.0.0.1", cores: Sequence[int] | None = None,
    replica_root: Path | None = None, served_model_name: str | None = None,
) -> list[ReplicaPlan]:
    """Split `cores` (default: this process's affinity) into `replicas` contiguous shares, sizes within
    one of each other (the first replicas take the remainder); ports `port`, `port`+1, … (0: a free one
    each); replica k serves `<DIR>-replica-<k>` beside DIR, or `<replica_root>/replica-<k>`."""
    usable = sorted(set(os.sched_getaffinity(0) if cores is None else cores))
    if replicas < 1:
        raise ConfigError(f"expected at least 1 replica, got {replicas}")
    if replicas > len(usable):
        raise ConfigError(f"expected at most {len(usable)} replicas (one core each), got {replicas}")
    if not 0 <= port <= 65536 - replicas:
        raise ConfigError(f"expected a port from 0 (a free one each) to {65536 - replicas} "
                          f"({replicas} replicas take port, port+1, …), got {port}")
    source = Path(model_dir).resolve()
    root = None if replica_root is None else Path(replica_root).resolve()
    share, extra = divmod(len(usable), replicas)
    plans: list[ReplicaPlan] = []
    first = 0
    for k, replica_port in enumerate(_ports(port=port, count=replicas, host=host)):
        size = share + (1 if k < extra else 0)
        copy = source.parent / f"{source.name}-replica-{k}" if root is None else root / f"replica-{k}"
        if copy.is_relative_to(source) or source.is_relative_to(copy):
            raise ConfigError(f"expected replica copies outside the model directory {source}, got {copy}")
        plans.append(ReplicaPlan(index=k, port=replica_port, cpus=tuple(usable[first:first + size]),
                                 model_dir=copy, model_name=served_model_name or str(source)))
        first += size
    return plans


def _ports(*, port: int, count: int, host: str) -> list[int]:
    if port:
        return [port + k for k in range(count)]
    ports: list[int] = []
    while len(ports) < count:  # the OS may hand the same free port out twice in a row
        candidate = free_port(host)
        if candidate not in ports:
            ports.append(candidate)
    return ports


def copy_model_dir(source: Path, target: Path) -> None:
    """Make `target` a fresh copy of model directory `source` (files the reload path left in an earlier
    copy go; the weights served are DIR's). Refuses to replace a directory that is not a model copy."""
    if not (source / "config.json").is_file():
        raise ConfigError(f"expected a model directory with a config.json, got {source}")
    if target.is_symlink() or (target.exists() and not (target / "config.json").is_file()):
        raise ConfigError(f"expected {target} to be absent or an earlier replica copy (a model directory), "
                          "got something else; move it or pass --replica-root")
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)


def start_all(servers: Sequence[VllmServer]) -> None:
    """Launch every server at once and block until all answer `/health`. The first that exits or times
    out stops them all and is raised, naming its URL; so does Ctrl-C."""
    try:
        for server in servers:
            server.launch()  # one thread: the pinning preexec_fn never forks beside another thread
        waiting = list(servers)
        with httpx.Client(timeout=2.0) as client:
            while waiting:
                for server in list(waiting):
                    try:
                        if server.healthy(client):
                            waiting.remove(server)
                    except ServerStartError as error:
                        raise ServerStartError(f"{server.api_url}: {error}") from None
                if waiting:
                    time.sleep(0.5)
    except BaseException:
        stop_all(servers)
        raise


def stop_all(servers: Sequence[VllmServer]) -> None:
    """Stop every server, in parallel (each may take its grace period)."""
    with ThreadPoolExecutor(max_workers=max(len(servers), 1)) as pool:
        list(pool.map(lambda server: server.stop(), servers))


def wait_first_exit(servers: Sequence[VllmServer], *, poll_s: float = 0.5) -> VllmServer:
    """Block until one of the started servers exits on its own; that server."""
    while True:
        for server in servers:
            if server.poll() is not None:
                return server
        time.sleep(poll_s)
