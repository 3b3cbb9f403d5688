"""GRPO groups for the API: a run's groups with reward statistics (paged by group index), and one
group's rollouts side by side with the advantages the trainer used and the turn where they diverge.

Advantages are never computed here: the trainer stores the one it used on each episode (with the
reward after its shaping and normalisation); before a step trains on an episode it has none."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.pagination import decode_cursor, page
from api.schemas.groups import GroupPublic, GroupSummary
from api.services.episodes import EpisodeFilters, summary_rows
from api.services.runs import get as get_run
from core import archive, archive_reader
from core.errors import NotFound
from core.models import Environment, Episode, EpisodeGroup, Task, Turn
from core.termination import GroupStatus
from environments.rewards import ZERO_VARIANCE_SPREAD

PREVIEW_CHARS = 240
GROUP_COLUMNS = (
    EpisodeGroup.id, EpisodeGroup.run_id, EpisodeGroup.group_index, EpisodeGroup.task_id,
    EpisodeGroup.environment_id, EpisodeGroup.size, EpisodeGroup.policy_version, EpisodeGroup.status,
    EpisodeGroup.consumed_step, EpisodeGroup.drop_reason, EpisodeGroup.dropped_step, EpisodeGroup.created_at,
    Environment.name.label("environment"),
)


def _reward_stats(session: Session, group_ids: list[int]) -> dict[int, tuple[int, float | None, float | None, bool]]:
    """group id → (rewarded episodes, mean, population std, all rewards equal: no more apart than the
    trainer's zero-variance spread)."""
    if not group_ids:
        return {}
    query = (
        select(Episode.group_id, func.count(Episode.reward), func.avg(Episode.reward), func.stddev_pop(Episode.reward),
               func.max(Episode.reward) - func.min(Episode.reward))
        .where(Episode.group_id.in_(group_ids)).group_by(Episode.group_id)
    )
    return {gid: (n, mean, std, spread is not None and spread <= ZERO_VARIANCE_SPREAD) for gid, n, mean, std, spread in session.execute(query)}


def _with_stats(row: dict[str, Any], stats: tuple[int, float | None, float | None, bool] | None) -> dict[str, Any]:
    rewarded, mean, std, equal = stats or (0, None, None, False)
    degenerate = row["status"] != GroupStatus.RUNNING and rewarded >= 2 and equal
    return {**row, "rewarded": rewarded, "reward_mean": mean, "reward_std": std, "degenerate": degenerate}


def list_groups(
    session: Session, *, run_id: int, status: str | None, cursor: str | None, limit: int
) -> tuple[list[GroupSummary], str | None]:
    """A run's groups, the latest dispatched first."""
    get_run(session, run_id=run_id)
    after = decode_cursor(cursor, types=[int])
    query = (
        select(*GROUP_COLUMNS).join(Environment, Environment.id == EpisodeGroup.environment_id)
        .where(EpisodeGroup.run_id == run_id).order_by(EpisodeGroup.group_index.desc())
    )
    if status is not None:
        query = query.where(EpisodeGroup.status == status)
    if after is not None:
        query = query.where(EpisodeGroup.group_index < after[0])
    rows = [dict(row._mapping) for row in session.execute(query.limit(limit + 1))]
    kept, next_cursor = page(rows, limit=limit, key=lambda row: [row["group_index"]])
    stats = _reward_stats(session, [row["id"] for row in kept])
    return [GroupSummary.model_validate(_with_stats(row, stats.get(row["id"]))) for row in kept], next_cursor


def _trained_values(session: Session, episode_ids: list[int]) -> dict[int, tuple[float | None, float | None]]:
    """episode id → (advantage, trained score) as the trainer stored them."""
    query = select(Episode.id, Episode.advantage, Episode.trained_score).where(Episode.id.in_(episode_ids))
    return {row.id: (row.advantage, row.trained_score) for row in session.execute(query)}


def _previews(session: Session, *, run_id: int, episode_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    previews: dict[int, list[dict[str, Any]]] = defaultdict(list)
    archived = archive.location(session, run_id)
    if archived is not None:
        for turn in archive_reader.read_turns(archived, episode_ids=episode_ids,
                                       columns=("completion_text", "tool_call", "exit_code", "truncated")):
            text = turn["completion_text"]
            previews[turn["episode_id"]].append({
                "episode_id": turn["episode_id"], "index": turn["index"], "text": text[:PREVIEW_CHARS],
                "tool": _json_text(turn["tool_call"], "name"), "exit_code": turn["exit_code"],
                "truncated": turn["truncated"], "digest": hashlib.md5(text.encode()).hexdigest()})
        return previews
    query = (
        select(Turn.episode_id, Turn.index, func.left(Turn.completion_text, PREVIEW_CHARS).label("text"),
               Turn.tool_call["name"].astext.label("tool"), Turn.exit_code, Turn.truncated,
               func.md5(Turn.completion_text).label("digest"))
        .where(Turn.run_id == run_id, Turn.episode_id.in_(episode_ids)).order_by(Turn.episode_id, Turn.index)
    )
    for row in session.execute(query):
        previews[row.episode_id].append(dict(row._mapping))
    return previews


def _json_text(document: Any, key: str) -> str | None:
    """`document ->> key` as Postgres gives it: a string as is, another JSON value as its text, else None."""
    value = document.get(key) if isinstance(document, dict) else None
    return value if value is None or isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def divergence_turn(turns_by_episode: list[list[dict[str, Any]]]) -> int | None:
    """The first turn index where the completions differ or a rollout has ended; None if all agree."""
    if len(turns_by_episode) < 2:
        return None
    longest = max(len(turns) for turns in turns_by_episode)
    for index in range(longest):
        digests = {turns[index]["digest"] if index < len(turns) else None for turns in turns_by_episode}
        if len(digests) > 1:
            return index
    return None


def show_group(session: Session, *, group_id: int) -> GroupPublic:
    query = (
        select(*GROUP_COLUMNS, Task.external_id.label("task_external_id"))
        .join(Environment, Environment.id == EpisodeGroup.environment_id).join(Task, Task.id == EpisodeGroup.task_id)
        .where(EpisodeGroup.id == group_id)
    )
    found = session.execute(query).one_or_none()
    if found is None:
        raise NotFound(f"no group with id {group_id}; GET /v1/runs/{{run_id}}/groups lists a run's groups")
    group = dict(found._mapping)
    episodes, _ = summary_rows(session, filters=EpisodeFilters(group_id=group_id), cursor=None, limit=1024)
    episodes.sort(key=lambda episode: episode["sample_index"])
    previews = _previews(session, run_id=group["run_id"], episode_ids=[e["id"] for e in episodes])
    turns = [previews.get(e["id"], []) for e in episodes]
    trained = _trained_values(session, [e["id"] for e in episodes])
    rollouts = [{**episode, "advantage": trained[episode["id"]][0], "trained_score": trained[episode["id"]][1],
                 "turns": turn_list} for episode, turn_list in zip(episodes, turns, strict=True)]
    stats = _reward_stats(session, [group_id]).get(group_id)
    return GroupPublic.model_validate(
        {**_with_stats(group, stats), "divergence_turn": divergence_turn(turns), "rollouts": rollouts})
