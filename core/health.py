"""Health checks behind `crucible doctor`: what is wrong and how to fix it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.errors import CrucibleError
from core.redact import mask
from core.settings import Settings, public_url

MIN_FREE_DISK_GB = 5.0


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    required: bool
    detail: str
    fix: str = ""


def broker_url_for(settings: Settings, database_url: str) -> str:
    """The configured broker, or Celery's SQLAlchemy transport on the database."""
    if settings.broker_url is not None:
        return settings.broker_url
    return "sqla+" + database_url


def check_database(settings: Settings) -> tuple[CheckResult, str | None]:
    from core.db import check_database as ping
    from core.db import get_engine, resolve_database_url

    where = "embedded Postgres" if settings.uses_embedded_database else "CRUCIBLE_DATABASE_URL"
    try:
        url = resolve_database_url(settings)
        version = ping(get_engine(settings))
    except CrucibleError as error:
        fix = (
            "check the embedded server's log under the data dir, or set CRUCIBLE_DATABASE_URL"
            if settings.uses_embedded_database
            else "start PostgreSQL or correct CRUCIBLE_DATABASE_URL"
        )
        return CheckResult("database", False, True, str(error), fix), None
    return CheckResult("database", True, True, f"{where}, PostgreSQL {version}"), url


def check_broker(settings: Settings, database_url: str | None) -> CheckResult:
    from kombu.connection import Connection

    if settings.broker_url is None and database_url is None:
        return CheckResult("broker", False, True, "no database, so no SQLAlchemy broker", "fix the database first")
    url = broker_url_for(settings, database_url or "")
    shown = "SQLAlchemy transport on the database" if settings.broker_url is None else mask(url)
    try:
        connect: Any = Connection  # kombu's constructor is untyped
        with connect(url, connect_timeout=3) as connection:
            connection.ensure_connection(max_retries=1, timeout=3)
    except Exception as error:  # kombu raises transport-specific errors
        return CheckResult(
            "broker", False, True, f"cannot reach {shown}: {error}", "start the broker or correct CRUCIBLE_BROKER_URL"
        )
    return CheckResult("broker", True, True, shown)


def check_docker() -> CheckResult:
    import docker

    try:
        client = docker.from_env(timeout=5)
        try:
            version = client.version()
        finally:
            client.close()
    except Exception as error:  # docker raises DockerException subclasses and requests errors
        return CheckResult(
            "docker engine", False, True, f"not reachable: {error}",
            "apt-get install docker.io && dockerd --bridge=none --iptables=false &",
        )
    return CheckResult("docker engine", True, True, f"Docker {version.get('Version', '?')}")


def check_policy_server(settings: Settings, held: dict[str, list[HeldOut]] | None = None) -> CheckResult:
    """One server (CRUCIBLE_POLICY_URL): the check "policy server"."""
    return _check_policy_replica(settings.policy_url, "policy server", "CRUCIBLE_POLICY_URL", held or {})


def check_policy_pool(settings: Settings, held: dict[str, list[HeldOut]] | None = None) -> list[CheckResult]:
    """Each replica of CRUCIBLE_POLICY_URLS, as "policy replica N"; one server: "policy server". `held`:
    the workers' own view (held_out): a replica a live worker keeps out of rotation is a failed row."""
    if not settings.policy_urls:
        return [check_policy_server(settings, held)]
    return [_check_policy_replica(url, f"policy replica {index}", "CRUCIBLE_POLICY_URLS", held or {})
            for index, url in enumerate(settings.policy_urls, start=1)]


@dataclass(frozen=True)
class ReplicaStatus:
    """One policy server as a client sees it now."""

    name: str
    """Its URL without credentials (as turns name it)."""
    serving: bool
    """It lists a model and is not paused: episodes can be sampled there."""
    models: list[str]
    paused: bool | None
    """vLLM's dev route `/is_paused` (the trainer pauses a replica whose weights failed their probe, and
    every replica for the moment of a weight load); None where the server has no such route."""
    weight_version: str | None
    """The version tag it serves (`/weight_info`; "default" after a restart until re-synced)."""
    error: str | None


@dataclass(frozen=True)
class HeldOut:
    """A live worker that sends a replica no new episode (its pool took it out of rotation)."""

    worker: str
    until: datetime
    """When that worker re-probes it (sooner if every replica it has is down)."""
    error: str | None


def held_out(engine: Engine | None = None) -> dict[str, list[HeldOut]]:
    """Replica name → the live workers holding it out of rotation, from their last heartbeats."""
    from pydantic import ValidationError
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from core.db import session_scope
    from core.models import Worker
    from core.models.worker import alive
    from core.schemas.worker import ReplicasOut

    try:
        with session_scope(engine) as session:
            rows = session.execute(
                select(Worker.name, Worker.replicas_out).where(Worker.replicas_out.is_not(None), alive())
            ).all()
    except SQLAlchemyError:  # a database not migrated yet (`crucible doctor` on a new one): no worker has beaten
        return {}
    found: dict[str, list[HeldOut]] = {}
    for worker, replicas in rows:
        try:
            published = ReplicasOut.validate_python(replicas or {})
        except ValidationError:
            continue  # written by our heartbeat only (core.schemas.worker); a row it did not write is not news
        for name, state in published.items():
            try:
                until = datetime.fromtimestamp(state.until, UTC)
            except (OverflowError, OSError, ValueError):
                continue
            found.setdefault(name, []).append(HeldOut(str(worker), until, state.error))
    return found


def policy_replica_status(base_url: str, *, timeout_s: float = 3.0) -> ReplicaStatus:
    shown = public_url(base_url)  # never a password in a report
    root = base_url.removesuffix("/").removesuffix("/v1")
    try:
        response = httpx.get(f"{root}/v1/models", timeout=timeout_s)
        response.raise_for_status()
        models = [str(m.get("id")) for m in response.json().get("data", [])]
    except (httpx.HTTPError, ValueError, AttributeError) as error:
        why = f"{type(error).__name__}: {str(error).replace(base_url, shown).replace(root, public_url(root))[:300]}"
        return ReplicaStatus(shown, False, [], None, None, why)
    paused = _dev_route(f"{root}/is_paused", "is_paused", timeout_s)
    version = _dev_route(f"{root}/weight_info", "weight_version", timeout_s)
    return ReplicaStatus(shown, bool(models) and paused is not True, models,
                         paused if isinstance(paused, bool) else None, None if version is None else str(version), None)


def _dev_route(url: str, key: str, timeout_s: float) -> object:
    """A field of one of vLLM's dev-mode routes, or None where the server has no such route."""
    try:
        response = httpx.get(url, timeout=timeout_s)
        return response.json().get(key) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def _check_policy_replica(base_url: str, name: str, setting: str, held: dict[str, list[HeldOut]]) -> CheckResult:
    status = policy_replica_status(base_url)
    if held.get(status.name):
        workers = "; ".join(f"{h.worker} until {h.until:%H:%M:%S} UTC ({(h.error or '')[:120]})"
                            for h in held[status.name])
        return CheckResult(name, False, False, f"{status.name}: out of rotation on {workers}",
                           "a worker re-probes it at that time and sends it episodes again once it answers")
    if status.error is not None:
        return CheckResult(name, False, False, f"{status.name}: {status.error}",
                           f"start one with `crucible serve MODEL_DIR` or correct {setting}")
    version = f", weights {status.weight_version}" if status.weight_version is not None else ""
    if status.paused:
        return CheckResult(name, False, False, f"{status.name} serving {', '.join(status.models)}{version}, PAUSED",
                           "the trainer pauses a replica whose weights failed their probe (see runs.sync_error; "
                           "it re-syncs it within 30 s) — or it is mid weight load: check again")
    return CheckResult(name, True, False, f"{status.name} serving {', '.join(status.models)}{version}")


def check_disk(settings: Settings) -> CheckResult:
    path = settings.data_dir
    while not path.exists():
        path = path.parent
    free_gb = shutil.disk_usage(path).free / 2**30
    ok = free_gb >= MIN_FREE_DISK_GB
    return CheckResult(
        "disk", ok, False, f"{free_gb:.1f} GiB free under {settings.data_dir}",
        "" if ok else f"free at least {MIN_FREE_DISK_GB:.0f} GiB or move CRUCIBLE_DATA_DIR",
    )


GONE_SHOWN_FOR_S = 86400.0
"""A host whose workers stopped beating without a clean stop is shown as gone for this long after."""


@dataclass(frozen=True)
class WorkerHost:
    """A worker host as its workers' heartbeats show it: `up` while one of them beats, else gone."""

    hostname: str
    workers: tuple[str, ...]
    beating: tuple[str, ...]
    silent_s: float
    """Seconds since the last beat of any of its workers."""
    running: int
    """Episodes still marked running by its workers (a gone host's are requeued by the controller)."""

    @property
    def up(self) -> bool:
        return bool(self.beating)


def worker_hosts(session: Session) -> list[WorkerHost]:
    """Every worker host seen in the last GONE_SHOWN_FOR_S, by hostname: up (a worker beats there), or gone
    (its workers stopped beating without a clean stop: the host, its engine or its processes were lost).
    What `crucible doctor` and the dashboard show."""
    from sqlalchemy import func, select

    from core.models import Episode, Worker
    from core.models.worker import alive

    rows = session.execute(
        select(Worker.hostname, Worker.name, alive().label("alive"), Worker.last_heartbeat_at,
               select(func.count()).where(Episode.worker_incarnation == Worker.incarnation,
                                          Episode.status == "running").scalar_subquery().label("running"))
        .where(Worker.stopped_at.is_(None), Worker.last_heartbeat_at >= func.now() - timedelta(seconds=GONE_SHOWN_FOR_S))
        .order_by(Worker.hostname, Worker.name)).all()
    now = session.execute(select(func.now())).scalar_one()
    by_host: dict[str, list[Any]] = {}
    for row in rows:
        by_host.setdefault(str(row.hostname), []).append(row)
    return [WorkerHost(hostname=host, workers=tuple(w.name for w in workers),
                       beating=tuple(w.name for w in workers if w.alive),
                       silent_s=(now - max(w.last_heartbeat_at for w in workers)).total_seconds(),
                       running=sum(int(w.running) for w in workers))
            for host, workers in by_host.items()]


def check_worker_hosts(engine: Engine | None = None) -> list[CheckResult]:
    """One row per worker host (worker_hosts): up, or gone with the episodes still marked running there."""
    from sqlalchemy.exc import SQLAlchemyError

    from core.db import session_scope

    try:
        with session_scope(engine) as session:
            hosts = worker_hosts(session)
    except SQLAlchemyError:  # a database not migrated yet: no worker has beaten
        return []
    results = []
    for host in hosts:
        if host.up:
            results.append(CheckResult(f"worker host {host.hostname}", True, False,
                                       f"up: {', '.join(host.beating)} beating"))
            continue
        results.append(CheckResult(
            f"worker host {host.hostname}", False, False,
            f"gone: no beat for {host.silent_s:.0f} s (workers {', '.join(host.workers)}); "
            f"{host.running} episode(s) still marked running there",
            "the controller requeues its episodes; a worker started there again reaps the old sandboxes first"))
    return results


def run_checks(settings: Settings) -> list[CheckResult]:
    database, url = check_database(settings)
    held = held_out() if database.ok else {}
    hosts = check_worker_hosts() if database.ok else []
    return [check_docker(), database, check_broker(settings, url), *check_policy_pool(settings, held), *hosts,
            check_disk(settings)]


def wait_healthy(url: str, *, alive: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.2) -> None:
    """Block until GET `url` answers 200. RuntimeError naming `what` once `alive()` is false (the
    server's process ended) or after `timeout_s`."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if not alive():
            raise RuntimeError(f"{what} exited before {url} answered")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {url} did not answer 200 within {timeout_s:.0f} s")
        time.sleep(poll_s)
