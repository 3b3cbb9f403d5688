"""Sandbox lifecycle events as the API shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandboxes.admin import SandboxRow


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


class FleetSandboxesPublic(BaseModel):
    data: list[SandboxRow]
    """Each as the worker that holds it lists it (`worker`: that worker's name)."""
    unreachable: dict[str, str]
    """Live workers that did not answer, and why: their sandboxes are not in `data`."""


class SandboxExecPublic(BaseModel):
    sandbox_id: str
    worker: str
    stdout: str
    """stdout and stderr interleaved, capped head + tail."""
    exit_code: int
    status: str
    duration_s: float
    truncated_bytes: int


class ArchiveWritten(BaseModel):
    sandbox_id: str
    path: str
    bytes: int
