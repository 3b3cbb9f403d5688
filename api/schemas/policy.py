"""The policy pool as the API shows it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class HeldOutPublic(BaseModel):
    worker: str
    until: datetime
    error: str | None


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
    out_of_rotation: list[HeldOutPublic] = []
    """Live workers that send it no new episode now (their pool took it out after a failure), until when
    each re-probes it: the workers' own view, from their heartbeats. Empty: every worker uses it."""


class ReplicasPublic(BaseModel):
    data: list[ReplicaPublic]
