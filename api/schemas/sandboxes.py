"""Sandbox lifecycle events as the API shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class SandboxEventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    sandbox_id: str
    container_id: str | None
    kind: str
    worker: str | None
    run_id: int | None
    episode_id: int | None
    duration_ms: float | None
    detail: Any
    """Usually a mapping (command, exit_code…); shown as stored whatever its shape."""
    created_at: datetime


class SandboxEventsPublic(BaseModel):
    data: list[SandboxEventPublic]
    next_cursor: str | None
