"""Register and look up environment versions. A spec with a known hash returns that version."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.errors import NotFound
from core.models import Environment
from environments.spec import EnvironmentSpec, parse_spec


def register_environment(session: Session, *, spec: EnvironmentSpec) -> tuple[Environment, bool]:
    """Store `spec` as the next version of its name, unless an identical version exists.

    Returns the row and whether it is new. Concurrent registrations of the same name are serialised
    by a transaction-scoped advisory lock on the name.
    """
    spec_hash = spec.content_hash()
    session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"environment:{spec.name}"))))
    existing = session.execute(
        select(Environment).where(Environment.name == spec.name, Environment.spec_hash == spec_hash)
    ).scalar_one_or_none()
    if existing is not None:
        return existing, False
    latest = session.execute(
        select(func.max(Environment.version)).where(Environment.name == spec.name)
    ).scalar_one()
    row = Environment(
        name=spec.name, version=(latest or 0) + 1, kind=spec.kind, spec=spec.model_dump(mode="json"),
        spec_hash=spec_hash, description=spec.description,
    )
    session.add(row)
    try:
        session.flush()
    except IntegrityError:  # pragma: no cover - the advisory lock makes this unreachable
        session.rollback()
        raise
    return row, True


def get_environment(session: Session, *, name: str, version: int | None = None) -> Environment:
    """The pinned version, or the latest when `version` is None."""
    query = select(Environment).where(Environment.name == name)
    query = query.where(Environment.version == version) if version else query.order_by(Environment.version.desc())
    row = session.execute(query.limit(1)).scalar_one_or_none()
    if row is None:
        which = f"version {version} of " if version else ""
        raise NotFound(f"no {which}environment named {name!r}; `crucible env ls` lists the registered ones")
    return row


def list_environments(session: Session) -> list[Environment]:
    """The latest version of every environment, by name."""
    latest = (
        select(Environment.name, func.max(Environment.version).label("version")).group_by(Environment.name).subquery()
    )
    query = select(Environment).join(
        latest, (Environment.name == latest.c.name) & (Environment.version == latest.c.version)
    )
    return list(session.execute(query.order_by(Environment.name)).scalars())


def spec_of(row: Environment) -> EnvironmentSpec:
    return parse_spec(row.spec, source=f"environment {row.name} v{row.version}")
