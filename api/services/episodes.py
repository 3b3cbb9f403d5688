"""Episodes for the API: filtered lists of summaries (paged by id, never token arrays), one episode
with its turns, one turn's tokens, and the artifacts its observations produced (listed without their bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, text
from sqlalchemy.orm import Session

from api.pagination import decode_cursor, page
from api.schemas.episodes import ArtifactPublic, EpisodeDetail, EpisodeSummary, TurnPublic, TurnTokens
from api.services import json_shapes
from api.services.tokenizer import decode_pieces
from core import archive, archive_reader
from core.errors import NotFound
from core.models import Environment, Episode, EpisodeArtifact, EpisodeGroup, Run, Task, Turn
from core.termination import EpisodeStatus, GroupStatus
from environments.pairwise import pairwise_environments

SUMMARY_COLUMNS = (
    Episode.id, Episode.run_id, Episode.group_id, Episode.sample_index, Episode.task_id, Episode.environment_id,
    Episode.status, Episode.termination_reason, Episode.reward, Episode.reward_components, Episode.policy_version,
    Episode.policy_version_last, Episode.num_turns, Episode.num_tokens, Episode.prefix_breaks,
    Episode.unparsed_tool_calls, Episode.turns_without_tool_call, Episode.program, Episode.attempts, Episode.timings,
    Episode.sandbox_id, Episode.flags, Episode.created_at, Episode.finished_at,
)
TURN_COLUMNS = (
    Turn.index, Turn.prompt_length, Turn.completion_text, Turn.tool_call, Turn.observation, Turn.tool_output_full,
    Turn.exit_code, Turn.tool_status, Turn.duration_s, Turn.generation_s, Turn.truncated, Turn.truncated_bytes,
    Turn.weight_version, Turn.weight_version_end, Turn.finish_reason, Turn.replica, Turn.segment, Turn.created_at,
)


@dataclass(frozen=True, kw_only=True)
class EpisodeFilters:
    run_id: int | None = None
    environment: str | None = None
    """Environment name (every version)."""
    status: str | None = None
    termination_reason: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    policy_version: int | None = None
    group_id: int | None = None
    task_id: int | None = None
    flag: str | None = None
    """Only episodes the hack monitors flagged with this (core.flags.EpisodeFlag)."""
    q: str | None = None
    """Full-text search in the turns (completions and tool outputs), web-search syntax."""


def _summaries() -> Any:
    return select(*SUMMARY_COLUMNS, Environment.name.label("environment"), _awaiting_judging()).join(
        Environment, Environment.id == Episode.environment_id)


def _awaiting_judging() -> Any:
    """Played, its judge's score not in yet: `scoring` (its pointwise judge or reward model did not answer:
    asked again, task_workers/episode/learned.py), or ended in a group a pairwise judge has not scored yet.
    What is stored meanwhile is the tests' part alone, not the reward."""
    group_running = exists().where(EpisodeGroup.id == Episode.group_id, EpisodeGroup.status == GroupStatus.RUNNING)
    return or_(Episode.status == EpisodeStatus.SCORING,
               and_(Episode.status == EpisodeStatus.COMPLETED, group_running,
                    Episode.environment_id.in_(pairwise_environments()))).label("awaiting_judging")


def _filtered(session: Session, query: Any, filters: EpisodeFilters) -> Any:
    """`query` with the filters' conditions; a search (`q`) reads runs whose turns are in Postgres only."""
    equal = ((Episode.run_id, filters.run_id), (Episode.status, filters.status),
             (Episode.termination_reason, filters.termination_reason), (Episode.policy_version, filters.policy_version),
             (Episode.group_id, filters.group_id), (Episode.task_id, filters.task_id))
    for column, value in equal:
        if value is not None:
            query = query.where(column == value)
    if filters.environment is not None:
        query = query.where(Episode.environment_id.in_(
            select(Environment.id).where(Environment.name == filters.environment)))
    if filters.flag is not None:
        query = query.where(Episode.flags.contains([filters.flag]))  # GIN: ix_episodes_flags
    if filters.min_reward is not None:
        query = query.where(Episode.reward >= filters.min_reward)
    if filters.max_reward is not None:
        query = query.where(Episode.reward <= filters.max_reward)
    if filters.q:
        if filters.run_id is not None and (archived := archive.location(session, filters.run_id)) is not None:
            raise archive.ArchiveError(f"run {filters.run_id} is archived ({archived.name}): its turns are not searchable; "
                                       f"`crucible runs restore {filters.run_id}` brings them back")
        matches = Turn.search.op("@@")(func.websearch_to_tsquery("simple", filters.q))
        query = query.where(exists().where(Turn.run_id == Episode.run_id, Turn.episode_id == Episode.id, matches))
    return query


def _run_span(session: Session, run_id: int) -> tuple[int, int] | None:
    """The run's lowest and highest episode ids (two probes of the (run_id, id) index), or None.

    A run's newest-first list is planned as a backward walk of the primary key that skips other runs'
    episodes: the planner takes run ids to be spread evenly over episode ids, so it expects a match
    every other row, while an older run's episodes all lie below every later run's (a walk of 560k
    rows at ten million turns). Bounding the ids to the run's span keeps any plan inside the run."""
    low, high = session.execute(select(func.min(Episode.id), func.max(Episode.id)).where(Episode.run_id == run_id)).one()
    return None if low is None else (low, high)


def list_episodes(
    session: Session, *, filters: EpisodeFilters, cursor: str | None, limit: int
) -> tuple[list[EpisodeSummary], str | None]:
    """Newest first."""
    rows, next_cursor = summary_rows(session, filters=filters, cursor=cursor, limit=limit)
    return [EpisodeSummary.model_validate(row) for row in rows], next_cursor


def summary_rows(
    session: Session, *, filters: EpisodeFilters, cursor: str | None, limit: int
) -> tuple[list[dict[str, Any]], str | None]:
    """`list_episodes` as the rows its summaries are made of (for a view that adds to each, as a group's
    rollouts do, and validates them once)."""
    after = decode_cursor(cursor, types=[int])
    if filters.q:
        # Plan with the actual query and limit: a generic plan (psycopg prepares a statement run five
        # times) cannot prune partitions nor see the LIMIT, and gathers every matching turn of every run
        # (8 s on ten million turns instead of 50 ms).
        session.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))
    query = _filtered(session, _summaries(), filters).order_by(Episode.id.desc())
    if filters.run_id is not None:
        span = _run_span(session, filters.run_id)
        if span is None:
            return [], None
        query = query.where(Episode.id.between(*span))
    if after is not None:
        query = query.where(Episode.id < after[0])
    rows = [json_shapes.episode(dict(row._mapping)) for row in session.execute(query.limit(limit + 1))]
    return page(rows, limit=limit, key=lambda row: [row["id"]])


def _episode_row(session: Session, episode_id: int) -> dict[str, Any]:
    query = _summaries().add_columns(
        Episode.worker, Episode.started_at, Episode.failures, Episode.verifier_layers, Episode.final_diff,
        Task.external_id.label("task_external_id"), Task.instruction,
    ).join(Task, Task.id == Episode.task_id).where(Episode.id == episode_id)
    row = session.execute(query).one_or_none()
    if row is None:
        raise NotFound(f"no episode with id {episode_id}; GET /v1/episodes lists them")
    return json_shapes.episode(dict(row._mapping))


TOKEN_COLUMNS = ("token_ids", "logprobs", "loss_mask")


def _turn_rows(session: Session, *, run_id: int, episode_id: int, tokens: bool) -> list[dict[str, Any]]:
    """The episode's turns as rows of TURN_COLUMNS and num_tokens (and TOKEN_COLUMNS with `tokens`), from
    the run's partition or, once the run is archived, from its archive."""
    archived = archive.location(session, run_id)
    if archived is None:
        extra = (Turn.token_ids, Turn.logprobs, Turn.loss_mask) if tokens else ()
        query = (
            select(*TURN_COLUMNS, func.coalesce(func.cardinality(Turn.token_ids), 0).label("num_tokens"), *extra)
            .where(Turn.run_id == run_id, Turn.episode_id == episode_id).order_by(Turn.index)
        )
        return [dict(row._mapping) for row in session.execute(query)]
    token_columns = TOKEN_COLUMNS if tokens else ("token_ids",)  # the ids count the tokens
    rows = archive_reader.read_turns(archived, episode_ids=[episode_id],
                              columns=[c.key for c in TURN_COLUMNS] + list(token_columns))
    turns = []
    for row in rows:
        turn = {column.key: row[column.key] for column in TURN_COLUMNS}
        turn["num_tokens"] = len(row["token_ids"] or ())
        if tokens:
            turn.update({column: row[column] for column in TOKEN_COLUMNS})
        turns.append(turn)
    return turns


def list_turns(session: Session, *, run_id: int, episode_id: int, tokens: bool, model: str) -> list[TurnPublic]:
    turns = []
    for row in _turn_rows(session, run_id=run_id, episode_id=episode_id, tokens=tokens):
        turn = json_shapes.turn(row)
        if tokens:
            ids = turn.pop("token_ids")
            turn["tokens"] = {"token_ids": ids, "logprobs": turn.pop("logprobs"), "loss_mask": turn.pop("loss_mask"),
                              "pieces": decode_pieces(model=model, token_ids=ids)}
        turns.append(TurnPublic.model_validate(turn))
    return turns


def show_episode(session: Session, *, episode_id: int, tokens: bool = False) -> EpisodeDetail:
    episode = _episode_row(session, episode_id)
    model = session.execute(select(Run.model).where(Run.id == episode["run_id"])).scalar_one()
    turns = list_turns(session, run_id=episode["run_id"], episode_id=episode_id, tokens=tokens, model=model)
    return EpisodeDetail.model_validate({**episode, "turns": turns})


def turn_tokens(session: Session, *, episode_id: int, index: int) -> TurnTokens:
    """One turn's token ids, logprobs and loss mask, decoded when the run's model has a tokenizer."""
    found = session.execute(select(Episode.run_id, Run.model, Run.archive_path, Run.archive_sha256)
                            .join(Run, Run.id == Episode.run_id).where(Episode.id == episode_id)).one_or_none()
    if found is None:  # no such episode: no such turn either (the same 404 as a missing turn)
        raise _no_turn(episode_id, index)
    row: Any = None
    if found.archive_path is None:
        row = session.execute(  # the turns' primary key leads with run_id: give it, or the lookup scans every turn
            select(Turn.token_ids, Turn.logprobs, Turn.loss_mask)
            .where(Turn.run_id == found.run_id, Turn.episode_id == episode_id, Turn.index == index)
        ).one_or_none()
    else:
        archived = archive.checked(found.run_id, found.archive_path, found.archive_sha256)
        assert archived is not None
        turns = archive_reader.read_turns(archived, episode_ids=[episode_id], columns=TOKEN_COLUMNS)
        row = next(((t["token_ids"], t["logprobs"], t["loss_mask"]) for t in turns if t["index"] == index), None)
    if row is None:
        raise _no_turn(episode_id, index)
    ids, logprobs, mask = row
    return TurnTokens(token_ids=ids, logprobs=logprobs, loss_mask=mask,
                      pieces=decode_pieces(model=found.model, token_ids=ids))


def _no_turn(episode_id: int, index: int) -> NotFound:
    return NotFound(f"episode {episode_id} has no turn {index}; GET /v1/episodes/{episode_id} lists its turns")


def list_artifacts(session: Session, *, episode_id: int) -> list[ArtifactPublic]:
    """The episode's artifacts without their bytes: the opening observation's first, then by turn."""
    if session.execute(select(Episode.id).where(Episode.id == episode_id)).scalar_one_or_none() is None:
        raise NotFound(f"no episode with id {episode_id}; GET /v1/episodes lists them")
    query = (
        select(EpisodeArtifact.id, EpisodeArtifact.turn_index, EpisodeArtifact.name, EpisodeArtifact.media_type,
               EpisodeArtifact.size)
        .where(EpisodeArtifact.episode_id == episode_id)
        .order_by(EpisodeArtifact.turn_index.asc().nulls_first(), EpisodeArtifact.id)
    )
    return [ArtifactPublic.model_validate(row) for row in session.execute(query)]


def artifact_content(session: Session, *, episode_id: int, artifact_id: int) -> tuple[str, bytes]:
    """One artifact's media type and bytes; NotFound unless it belongs to this episode."""
    query = select(EpisodeArtifact.media_type, EpisodeArtifact.data).where(
        EpisodeArtifact.id == artifact_id, EpisodeArtifact.episode_id == episode_id)
    row = session.execute(query).one_or_none()
    if row is None:
        raise NotFound(f"episode {episode_id} has no artifact {artifact_id}; "
                       f"GET /v1/episodes/{episode_id}/artifacts lists them")
    return row.media_type, bytes(row.data)
