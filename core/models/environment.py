"""Environments (versioned specs) and their tasks."""

from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from core.models.base import Base, created_at_column


class Environment(Base):
    """One version of an environment spec. Immutable: a changed spec registers a new version."""

    __tablename__ = "environments"
    __table_args__ = (
        UniqueConstraint("name", "version"),
        UniqueConstraint("name", "spec_hash"),
        CheckConstraint("version >= 1", name="version_positive"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]
    spec_hash: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = created_at_column()


class Task(Base):
    """One problem of an environment, with its split and the pass-rate job's measurement. Each run seeds
    its own rate from that measurement and moves only its own (core.models.task_rate.RunTaskRate)."""

    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("environment_name", "external_id"),
        Index(None, "environment_name", "split", "difficulty"),
        CheckConstraint("pass_rate IS NULL OR (pass_rate >= 0 AND pass_rate <= 1)", name="pass_rate_range"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    environment_name: Mapped[str] = mapped_column(String(128))
    external_id: Mapped[str] = mapped_column(String(256))
    split: Mapped[str] = mapped_column(String(32), default="train")
    instruction: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]]
    """Kind-specific: repo snapshot reference, public and hidden checks, setup commands."""
    pass_rate: Mapped[float | None] = mapped_column(Float)
    """The pass-rate job's measurement (controller.pass_rate); no training run moves it."""
    pass_rate_samples: Mapped[int] = mapped_column(Integer, default=0)
    pass_rate_policy_version: Mapped[int | None]
    pass_rate_rule: Mapped[dict[str, Any] | None]
    """The core.schemas.run.SuccessRule the pass rate was measured with (the pass-rate job's); the
    trainer's online update counts passes by it. None: never measured by a job."""
    episode_seconds: Mapped[float | None] = mapped_column(Float)
    """An exponential average of its episodes' seconds, moved by every run's trainer (one update per
    step that examines the task): what `dispatch_order: longest_first` sorts by, a hint shared by the
    runs. None: not measured."""
    difficulty: Mapped[str | None] = mapped_column(String(16))
    """Curriculum bucket: easy, medium or hard (from the pass rate)."""
    created_at: Mapped[datetime] = created_at_column()
