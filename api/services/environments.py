"""Environment versions for the API: register, latest of each name (paged by name), versions, one."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from api.pagination import decode_cursor, page
from api.schemas.environments import EnvironmentPublic, EnvironmentRegistered, EnvironmentSummary
from core.models import Environment, Task
from core.settings import get_settings
from environments.service import get_environment, register_environment
from environments.spec import EnvironmentSpec, check_network_policy, check_reward_servers

Shown = TypeVar("Shown", bound=EnvironmentSummary)


def _task_counts(session: Session, names: list[str]) -> dict[str, int]:
    if not names:
        return {}
    query = select(Task.environment_name, func.count()).where(Task.environment_name.in_(names))
    return dict(session.execute(query.group_by(Task.environment_name)).all())


def _with_counts(session: Session, rows: list[Environment], model: type[Shown], **extra: Any) -> list[Shown]:
    """Each row as `model` (its columns, `extra`, and the tasks uploaded under its name)."""
    counts = _task_counts(session, sorted({row.name for row in rows}))
    return [model.model_validate({**_columns(row), "tasks": counts.get(row.name, 0), **extra}) for row in rows]


def _columns(row: Environment) -> dict[str, Any]:
    return {column: getattr(row, column) for column in
            ("id", "name", "version", "kind", "description", "spec_hash", "created_at", "spec")}


def register(session: Session, *, spec: EnvironmentSpec) -> EnvironmentRegistered:
    check_network_policy(spec, allowed=get_settings().sandbox_networks)
    check_reward_servers(spec, allows=get_settings().allows_reward_server)
    row, created = register_environment(session, spec=spec)
    return _with_counts(session, [row], EnvironmentRegistered, created=created)[0]


def list_latest(session: Session, *, cursor: str | None, limit: int) -> tuple[list[EnvironmentSummary], str | None]:
    """The latest version of each name, by name."""
    after = decode_cursor(cursor, types=[str])
    query: Select[Environment] = (
        select(Environment).ext(distinct_on(Environment.name)).order_by(Environment.name, Environment.version.desc())
    )
    if after is not None:
        query = query.where(Environment.name > after[0])
    rows = list(session.execute(query.limit(limit + 1)).scalars())
    kept, next_cursor = page(rows, limit=limit, key=lambda row: [row.name])
    return _with_counts(session, kept, EnvironmentSummary), next_cursor


def list_versions(
    session: Session, *, name: str, cursor: str | None, limit: int
) -> tuple[list[EnvironmentSummary], str | None]:
    """Every version of `name`, newest first (NotFound when the name is unknown)."""
    get_environment(session, name=name)
    after = decode_cursor(cursor, types=[int])
    query = select(Environment).where(Environment.name == name).order_by(Environment.version.desc())
    if after is not None:
        query = query.where(Environment.version < after[0])
    rows = list(session.execute(query.limit(limit + 1)).scalars())
    kept, next_cursor = page(rows, limit=limit, key=lambda row: [row.version])
    return _with_counts(session, kept, EnvironmentSummary), next_cursor


def show(session: Session, *, name: str, version: int | None) -> EnvironmentPublic:
    return _with_counts(session, [get_environment(session, name=name, version=version)], EnvironmentPublic)[0]
