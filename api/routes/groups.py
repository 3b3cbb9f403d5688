"""`/v1/runs/{run_id}/groups` and `/v1/groups/{group_id}`: GRPO groups with rewards and advantages."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.deps import SessionDep, current_token
from api.pagination import DEFAULT_LIMIT, Cursor, Limit
from api.params import GroupId, RunId
from api.schemas.common import ERROR_RESPONSES
from api.schemas.groups import GroupPublic, GroupsPublic
from api.services import groups
from core.termination import GroupStatus

router = APIRouter(tags=["groups"], dependencies=[Depends(current_token)], responses=ERROR_RESPONSES)


@router.get("/v1/runs/{run_id}/groups", response_model=GroupsPublic)
def list_groups(
    run_id: RunId, session: SessionDep, status: GroupStatus | None = None,
    cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT,
) -> GroupsPublic:
    """A run's groups, latest dispatched first, with reward mean/std and a degenerate flag."""
    data, next_cursor = groups.list_groups(session, run_id=run_id, status=status, cursor=cursor, limit=limit)
    return GroupsPublic(data=data, next_cursor=next_cursor)


@router.get("/v1/groups/{group_id}", response_model=GroupPublic)
def show_group(group_id: GroupId, session: SessionDep) -> GroupPublic:
    """One group's rollouts side by side: rewards, advantages, turn previews, the first divergent turn."""
    return groups.show_group(session, group_id=group_id)
