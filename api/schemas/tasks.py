"""Tasks as the API shows them: summaries in lists, the payload on one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class TaskSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    environment_name: str
    external_id: str
    split: str
    difficulty: str | None
    pass_rate: float | None
    pass_rate_samples: int
    created_at: datetime


class TaskPublic(TaskSummary):
    instruction: str
    pass_rate_policy_version: int | None
    payload: dict[str, Any]
    """Kind-specific; strings longer than `elide_over` characters (repo tarballs) are elided."""


class TasksPublic(BaseModel):
    data: list[TaskSummary]
    next_cursor: str | None


class TasksImported(BaseModel):
    environment: str
    imported: int
    """Tasks in the upload (new ones inserted, known external ids updated)."""
