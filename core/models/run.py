"""Runs, the environments they mix, their policy versions and training steps."""

from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from core.models.base import Base, created_at_column
from core.termination import RunPurpose

_PURPOSES = ", ".join(f"'{purpose.value}'" for purpose in RunPurpose)


class Run(Base):
    """A training run: model, environment mix, GRPO settings, budget. Has a current policy version."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint("group_size >= 1", name="group_size_positive"),
        CheckConstraint("batch_size >= 1", name="batch_size_positive"),
        CheckConstraint("max_staleness >= 0", name="max_staleness_nonnegative"),
        CheckConstraint("mode IN ('sync', 'async')", name="mode_known"),
        CheckConstraint(f"purpose IN ({_PURPOSES})", name="purpose_known"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    purpose: Mapped[str] = mapped_column(String(16), default=RunPurpose.TRAIN, server_default=RunPurpose.TRAIN.value)
    """core.termination.RunPurpose: train, pass_rate or eval."""
    model: Mapped[str] = mapped_column(Text)
    mode: Mapped[str] = mapped_column(String(8), default="async")
    group_size: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer)
    """Groups per training step."""
    max_staleness: Mapped[int] = mapped_column(Integer, default=1)
    policy_version: Mapped[int] = mapped_column(Integer, default=0)
    config: Mapped[dict[str, Any]]
    """The fully resolved launch config (loss, optimizer, budget, curriculum)."""
    sync_error: Mapped[str | None] = mapped_column(Text)
    """Why the last weight publish failed (the server kept the previous version); None once one succeeds."""
    created_at: Mapped[datetime] = created_at_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    archived_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """When `crucible runs archive` moved the run's turns out of Postgres; None: they are in its partition."""
    archive_path: Mapped[str | None] = mapped_column(Text)
    """The directory of the run's archived turns (Parquet files); None: not archived."""
    archive_sha256: Mapped[str | None] = mapped_column(String(64))
    """The archive file's SHA-256 when it was written: reads and restores check the file against this,
    not against the manifest beside it (whoever can rewrite the file can rewrite the manifest)."""


class RunEnvironment(Base):
    """An environment version a run uses (pinned) and its share of the mix."""

    __tablename__ = "run_environments"
    __table_args__ = (CheckConstraint("weight > 0", name="weight_positive"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), primary_key=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)


class PolicyVersion(Base):
    """Every checkpoint and weight push bumps a run's version; this row records it."""

    __tablename__ = "policy_versions"
    __table_args__ = (UniqueConstraint("run_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    training_step: Mapped[int | None] = mapped_column(Integer)
    sync_seconds: Mapped[float | None] = mapped_column(Float)
    probe_kl: Mapped[float | None] = mapped_column(Float)
    """Trainer-vs-vLLM logprob disagreement on the probe sequence when the weights were pushed."""
    created_at: Mapped[datetime] = created_at_column()


class TrainingStep(Base):
    """Per-step metrics, named `area/metric[/stat]`."""

    __tablename__ = "training_steps"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    policy_version: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]]
    points: Mapped[dict[str, Any] | None]
    """The run page's aggregate of the ended episodes this step trained on (episodes, reward mean/std/min/
    max, by environment, components, terminations), written by the trainer with the step so the page
    reads one row per step; None: a step written before the trainer kept it."""
    created_at: Mapped[datetime] = created_at_column()
