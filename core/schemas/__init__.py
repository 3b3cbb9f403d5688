"""Pydantic schemas shared across packages (separate from the ORM models)."""

from core.schemas.run import EnvironmentShare, RunConfig

__all__ = ["EnvironmentShare", "RunConfig"]
