"""The policy pool as the API shows it."""

from __future__ import annotations

from pydantic import BaseModel


class ReplicaPublic(BaseModel):
    name: str
    """The replica's URL without credentials (as turns name it)."""
    serving: bool
    """It lists a model and is not paused: episodes can be sampled there."""
    models: list[str]
    paused: bool | None
    """vLLM's `/is_paused`; None where the server has no such route."""
    weight_version: str | None
    """The weight version tag it serves ("default" after a restart until the trainer re-syncs it)."""
    error: str | None
    """Why it did not answer."""


class ReplicasPublic(BaseModel):
    data: list[ReplicaPublic]
