"""Environments (versioned specs) as the API shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class EnvironmentSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    version: int
    kind: str
    description: str
    spec_hash: str
    created_at: datetime
    tasks: int = 0
    """Tasks uploaded under this environment's name (every version shares them)."""


class EnvironmentPublic(EnvironmentSummary):
    spec: dict[str, Any]


class EnvironmentRegistered(EnvironmentPublic):
    created: bool
    """False when an identical spec was registered before (its version is returned)."""


class EnvironmentsPublic(BaseModel):
    data: list[EnvironmentSummary]
    next_cursor: str | None
