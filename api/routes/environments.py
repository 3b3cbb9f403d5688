"""`/v1/environments`: register a spec, list the latest of each, show one, list its versions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from api.deps import SessionDep, current_token
from api.pagination import DEFAULT_LIMIT, MAX_INT, Cursor, Limit
from api.params import EnvironmentName
from api.schemas.common import ERROR_RESPONSES
from api.schemas.environments import EnvironmentPublic, EnvironmentRegistered, EnvironmentsPublic
from api.services import environments
from environments.spec import EnvironmentSpec

router = APIRouter(prefix="/v1/environments", tags=["environments"], dependencies=[Depends(current_token)],
                   responses=ERROR_RESPONSES)


@router.post("", status_code=201, response_model=EnvironmentRegistered,
             responses={200: {"model": EnvironmentRegistered, "description": "The identical spec is registered."}})
def register_environment(spec: EnvironmentSpec, session: SessionDep, response: Response) -> EnvironmentRegistered:
    """Register an environment spec; a changed spec becomes the next version."""
    data = environments.register(session, spec=spec)
    session.commit()
    if not data.created:
        response.status_code = 200
    return data


@router.get("", response_model=EnvironmentsPublic)
def list_environments(
    session: SessionDep, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT
) -> EnvironmentsPublic:
    """The latest version of every environment, by name."""
    data, next_cursor = environments.list_latest(session, cursor=cursor, limit=limit)
    return EnvironmentsPublic(data=data, next_cursor=next_cursor)


@router.get("/{name}", response_model=EnvironmentPublic)
def show_environment(
    name: EnvironmentName, session: SessionDep, version: Annotated[int | None, Query(ge=1, le=MAX_INT)] = None
) -> EnvironmentPublic:
    """One environment version with its spec (the latest unless `version`)."""
    return environments.show(session, name=name, version=version)


@router.get("/{name}/versions", response_model=EnvironmentsPublic)
def list_versions(
    name: EnvironmentName, session: SessionDep, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT
) -> EnvironmentsPublic:
    """Every version of one environment, newest first."""
    data, next_cursor = environments.list_versions(session, name=name, cursor=cursor, limit=limit)
    return EnvironmentsPublic(data=data, next_cursor=next_cursor)
