"""`/v1/episodes`: filtered summaries (full-text search in turns), one episode with turns, one turn's tokens."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from api.deps import SessionDep, current_token
from api.pagination import DEFAULT_LIMIT, Cursor, Limit
from api.params import EpisodeId, OptionalId, OptionalInt, OptionalName, OptionalReward, TurnIndex
from api.schemas.common import ERROR_RESPONSES
from api.schemas.episodes import EpisodeDetail, EpisodesPublic, TurnTokens
from api.services import episodes
from api.services.episodes import EpisodeFilters
from core.flags import EpisodeFlag
from core.termination import EpisodeStatus, TerminationReason

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
) -> dict[str, Any]:
    """Episode summaries, newest first (no turns, no token arrays)."""
    data, next_cursor = episodes.list_episodes(session, filters=filters, cursor=cursor, limit=limit)
    return {"data": data, "next_cursor": next_cursor}


@router.get("/{episode_id}", response_model=EpisodeDetail)
def show_episode(
    episode_id: EpisodeId, session: SessionDep,
    tokens: Annotated[bool, Query(description="Include every turn's token ids, logprobs and loss mask.")] = False,
) -> dict[str, Any]:
    """One episode with all its turns, verifier layers and final diff."""
    return episodes.show_episode(session, episode_id=episode_id, tokens=tokens)


@router.get("/{episode_id}/turns/{index}/tokens", response_model=TurnTokens)
def turn_tokens(episode_id: EpisodeId, index: TurnIndex, session: SessionDep) -> dict[str, Any]:
    """One turn's token ids, logprobs and loss mask (decoded when the run's model has a tokenizer)."""
    return episodes.turn_tokens(session, episode_id=episode_id, index=index)
