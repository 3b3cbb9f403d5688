"""Sandbox events for the API: by sandbox id, or what one episode's sandbox went through."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from api.pagination import decode_cursor, page
from api.schemas.sandboxes import SandboxEventPublic
from core.errors import NotFound
from core.models import Episode, SandboxEvent

COMMAND_KINDS = ("exec", "timeout", "oom")
WINDOW_SLACK = timedelta(seconds=5)


def _paged(
    session: Session, query: Select[SandboxEvent], *, cursor: str | None, limit: int
) -> tuple[list[SandboxEventPublic], str | None]:
    after = decode_cursor(cursor, types=[int])
    if after is not None:
        query = query.where(SandboxEvent.id > after[0])
    rows = list(session.execute(query.order_by(SandboxEvent.id).limit(limit + 1)).scalars())
    kept, next_cursor = page(rows, limit=limit, key=lambda row: [row.id])
    return [SandboxEventPublic.model_validate(row) for row in kept], next_cursor


def sandbox_events(
    session: Session, *, sandbox_id: str, kind: str | None, cursor: str | None, limit: int
) -> tuple[list[SandboxEventPublic], str | None]:
    """Every event of one sandbox, oldest first."""
    query = select(SandboxEvent).where(SandboxEvent.sandbox_id == sandbox_id)
    if kind is not None:
        query = query.where(SandboxEvent.kind == kind)
    return _paged(session, query, cursor=cursor, limit=limit)


def episode_events(
    session: Session, *, episode_id: int, kind: str | None, cursor: str | None, limit: int
) -> tuple[list[SandboxEventPublic], str | None]:
    """Events tagged with the episode, and its sandbox's untagged events while the episode ran."""
    episode = session.execute(
        select(Episode.sandbox_id, Episode.started_at, Episode.finished_at).where(Episode.id == episode_id)
    ).one_or_none()
    if episode is None:
        raise NotFound(f"no episode with id {episode_id}; GET /v1/episodes lists them")
    condition = SandboxEvent.episode_id == episode_id
    if episode.sandbox_id and episode.started_at and episode.finished_at:
        condition = or_(condition, and_(
            SandboxEvent.sandbox_id == episode.sandbox_id, SandboxEvent.episode_id.is_(None),
            SandboxEvent.created_at.between(episode.started_at - WINDOW_SLACK, episode.finished_at + WINDOW_SLACK),
        ))
    query = select(SandboxEvent).where(condition)
    if kind is not None:
        query = query.where(SandboxEvent.kind == kind)
    return _paged(session, query, cursor=cursor, limit=limit)
