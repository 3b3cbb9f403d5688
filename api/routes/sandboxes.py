"""Sandbox events: `/v1/sandboxes/{sandbox_id}/events` and `/v1/episodes/{episode_id}/sandbox-events`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.deps import SessionDep, current_token
from api.pagination import DEFAULT_LIMIT, Cursor, Limit
from api.params import EpisodeId, SandboxId
from api.schemas.common import ERROR_RESPONSES
from api.schemas.sandboxes import SandboxEventsPublic
from api.services import sandboxes

router = APIRouter(tags=["sandboxes"], dependencies=[Depends(current_token)], responses=ERROR_RESPONSES)

Kind = Annotated[str | None, Query(min_length=1, max_length=32, pattern=r"^[a-z_]+$",
                                   description="Only this event kind (create, acquire, exec, reset, destroy…).")]


@router.get("/v1/sandboxes/{sandbox_id}/events", response_model=SandboxEventsPublic)
def list_sandbox_events(
    sandbox_id: SandboxId, session: SessionDep, kind: Kind = None, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT
) -> SandboxEventsPublic:
    """Every lifecycle event of one sandbox, oldest first."""
    data, next_cursor = sandboxes.sandbox_events(session, sandbox_id=sandbox_id, kind=kind, cursor=cursor, limit=limit)
    return SandboxEventsPublic(data=data, next_cursor=next_cursor)


@router.get("/v1/episodes/{episode_id}/sandbox-events", response_model=SandboxEventsPublic)
def list_episode_sandbox_events(
    episode_id: EpisodeId, session: SessionDep, kind: Kind = None, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT
) -> SandboxEventsPublic:
    """What the episode's sandbox went through while it ran, oldest first."""
    data, next_cursor = sandboxes.episode_events(session, episode_id=episode_id, kind=kind, cursor=cursor, limit=limit)
    return SandboxEventsPublic(data=data, next_cursor=next_cursor)
