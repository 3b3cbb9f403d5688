"""Path and query parameter types shared by the routes, bounded so that no value reaches Postgres
out of its column's range (an unbounded int would be a 500, not a 422)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from api.pagination import MAX_BIGINT, MAX_INT

RunId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="Run id.")]
EpisodeId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="Episode id.")]
GroupId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="Episode group id.")]
TaskId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="Task id.")]
TurnIndex = Annotated[int, Path(ge=0, le=MAX_INT, description="Turn index within the episode, from 0.")]
EnvironmentName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$",
                                      description="Environment name.")]
SandboxId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                description="Sandbox id (sb-…).")]

OptionalId = Annotated[int | None, Query(ge=1, le=MAX_BIGINT)]
OptionalInt = Annotated[int | None, Query(ge=0, le=MAX_INT)]
OptionalName = Annotated[str | None, Query(min_length=1, max_length=128, pattern=r"^[^\x00]*$")]
OptionalReward = Annotated[float | None, Query(allow_inf_nan=False, ge=-1e12, le=1e12)]
