"""Database engine and sessions.

    engine = get_engine()            # one per process, from settings (embedded Postgres if unset)
    with session_scope() as session: # commits on success, rolls back on error
        ...
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from core.embedded import ensure_embedded_postgres
from core.errors import ServiceUnavailable
from core.settings import Settings, get_settings

_lock = threading.Lock()
_engines: dict[str, Engine] = {}


def resolve_database_url(settings: Settings | None = None) -> str:
    """The URL this process uses: the configured one, or the embedded server's."""
    settings = settings or get_settings()
    if settings.database_url is not None:
        return settings.database_url
    return ensure_embedded_postgres(settings.data_dir)


def make_engine(url: str, *, settings: Settings | None = None) -> Engine:
    settings = settings or get_settings()
    return create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_pre_ping=True,
        connect_args={"connect_timeout": settings.db_connect_timeout_s},
    )


def get_engine(settings: Settings | None = None) -> Engine:
    """The process-wide engine for the resolved URL (created once, thread-safe)."""
    url = resolve_database_url(settings)
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = make_engine(url, settings=settings)
    return engine


def reset_engines() -> None:
    """Dispose every engine (after fork, in tests, or when settings change)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def check_database(engine: Engine) -> str:
    """Connect once and return the server version; ServiceUnavailable with a readable line if not."""
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SHOW server_version")).scalar_one())
    except OperationalError as error:
        where = make_url(str(engine.url)).render_as_string(hide_password=True)
        reason = str(error.orig).strip().splitlines()[0] if error.orig else str(error)
        raise ServiceUnavailable(
            f"CRUCIBLE_DATABASE_URL: cannot connect to {where} ({reason}); "
            "expected a reachable PostgreSQL server"
        ) from None


_LOST_STATES = ("57P01", "57P02", "57P03")
"""admin_shutdown, crash_shutdown, cannot_connect_now: the server was stopped, crashed or is starting."""


def lost_connection(error: BaseException) -> bool:
    """Whether `error` says the database connection was lost or could not be made — a terminated
    backend, a restart, a server not answering yet — rather than that the database refused the request.
    The work of a lost connection is to be retried on a new one; a refused request (a constraint, a
    value too large) never is."""
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True  # SQLAlchemy's dialect recognised a disconnect and invalidated the connection
    if isinstance(error, InterfaceError):
        return True  # psycopg: the connection is closed
    if not isinstance(error, OperationalError):
        return False
    state = getattr(error.orig, "sqlstate", None)
    return state is None or state.startswith("08") or state in _LOST_STATES  # None: no server reply at all


_sessionmakers: dict[int, sessionmaker[Session]] = {}


def session_factory(engine: Engine | None = None) -> sessionmaker[Session]:
    engine = engine or get_engine()
    key = id(engine)
    factory = _sessionmakers.get(key)
    if factory is None:
        factory = _sessionmakers[key] = sessionmaker(engine, expire_on_commit=False)
    return factory


@contextmanager
def session_scope(engine: Engine | None = None) -> Iterator[Session]:
    """A session that commits when the block ends and rolls back if it raises."""
    session = session_factory(engine)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


TRAINER_LOCK_NAMESPACE = 0x43525543
""""CRUC": the first key of every trainer's advisory lock (trainer.store.hold_trainer_lock), the run id the second."""


def live_trainers(session: Session, *, run_id: int | None = None) -> list[int]:
    """The runs (or only `run_id`) whose trainer lock a trainer process holds now, in this database: such a
    trainer may push weights at any moment."""
    only = "AND objid = :run " if run_id is not None else ""
    return [int(run) for run in session.execute(text(
        f"SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND classid = :namespace AND objsubid = 2 {only}"
        "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY objid"
    ), {"namespace": TRAINER_LOCK_NAMESPACE, "run": run_id}).scalars()]
