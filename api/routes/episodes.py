"""`/v1/episodes`: filtered summaries (full-text search in turns), one episode with turns, one turn's tokens,
the artifacts its observations produced (screenshots) and each one's bytes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from api.deps import SessionDep, current_token
from api.pagination import DEFAULT_LIMIT, MAX_BIGINT, Cursor, Limit
from api.params import EpisodeId, OptionalId, OptionalInt, OptionalName, OptionalReward, TurnIndex
from api.schemas.common import ERROR_RESPONSES
from api.schemas.episodes import ArtifactsPublic, EpisodeDetail, EpisodesPublic, TurnTokens
from api.services import episodes
from api.services.episodes import EpisodeFilters
from core.flags import EpisodeFlag
from core.models.artifact import ARTIFACT_MEDIA_TYPES
from core.termination import EpisodeStatus, TerminationReason

ArtifactId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="Artifact id (from the episode's artifact list).")]
# An artifact's bytes came out of a sandbox: whatever they are, a browser must never run them in this
# origin. Only allow-listed types are named (no sniffing), and the CSP sandboxes the document and
# forbids it every resource, should one be opened in a tab.
ARTIFACT_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox; frame-ancestors 'none'",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "private, max-age=3600",
}

router = APIRouter(prefix="/v1/episodes", tags=["episodes"], dependencies=[Depends(current_token)],
                   responses=ERROR_RESPONSES)


def episode_filters(
    run_id: OptionalId = None, environment: OptionalName = None, status: EpisodeStatus | None = None,
    termination_reason: TerminationReason | None = None, min_reward: OptionalReward = None,
    max_reward: OptionalReward = None, policy_version: OptionalInt = None, group_id: OptionalId = None,
    task_id: OptionalId = None, flag: EpisodeFlag | None = None,
    q: Annotated[str | None, Query(max_length=200, pattern=r"^[^\x00]*$",
                                   description="Full-text search in turns: words, \"a phrase\", -excluded.")] = None,
) -> EpisodeFilters:
    return EpisodeFilters(
        run_id=run_id, environment=environment, status=status, termination_reason=termination_reason,
        min_reward=min_reward, max_reward=max_reward, policy_version=policy_version, group_id=group_id,
        task_id=task_id, flag=flag, q=q or None,
    )


@router.get("", response_model=EpisodesPublic)
def list_episodes(
    session: SessionDep, filters: Annotated[EpisodeFilters, Depends(episode_filters)],
    cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT,
) -> EpisodesPublic:
    """Episode summaries, newest first (no turns, no token arrays)."""
    data, next_cursor = episodes.list_episodes(session, filters=filters, cursor=cursor, limit=limit)
    return EpisodesPublic(data=data, next_cursor=next_cursor)


@router.get("/{episode_id}", response_model=EpisodeDetail)
def show_episode(
    episode_id: EpisodeId, session: SessionDep,
    tokens: Annotated[bool, Query(description="Include every turn's token ids, logprobs and loss mask.")] = False,
) -> EpisodeDetail:
    """One episode with all its turns, verifier layers and final diff."""
    return episodes.show_episode(session, episode_id=episode_id, tokens=tokens)


@router.get("/{episode_id}/turns/{index}/tokens", response_model=TurnTokens)
def turn_tokens(episode_id: EpisodeId, index: TurnIndex, session: SessionDep) -> TurnTokens:
    """One turn's token ids, logprobs and loss mask (decoded when the run's model has a tokenizer)."""
    return episodes.turn_tokens(session, episode_id=episode_id, index=index)


@router.get("/{episode_id}/artifacts", response_model=ArtifactsPublic)
def list_artifacts(episode_id: EpisodeId, session: SessionDep) -> ArtifactsPublic:
    """The episode's artifacts (screenshots, the opening observation) without their bytes."""
    return ArtifactsPublic(data=episodes.list_artifacts(session, episode_id=episode_id))


@router.get("/{episode_id}/artifacts/{artifact_id}", response_class=Response, responses={
    200: {"description": "The artifact's bytes, as its media type.",
          "content": {media_type: {} for media_type in ARTIFACT_MEDIA_TYPES}}})
def artifact_content(episode_id: EpisodeId, artifact_id: ArtifactId, session: SessionDep) -> Response:
    """One artifact's bytes (a screenshot's PNG): only for an artifact of this episode."""
    media_type, data = episodes.artifact_content(session, episode_id=episode_id, artifact_id=artifact_id)
    if media_type not in ARTIFACT_MEDIA_TYPES:  # the table refuses any other: never trust it to
        return Response(data, media_type="application/octet-stream",
                        headers={**ARTIFACT_HEADERS, "Content-Disposition": "attachment"})
    return Response(data, media_type=media_type, headers=ARTIFACT_HEADERS)  # text/plain gets charset=utf-8
