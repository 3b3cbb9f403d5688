"""Re-grades of stored submissions: a newer grader's verdict kept beside the original, never over it
(task_workers/episode/regrade.py, `crucible episodes regrade`)."""

from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, Float, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from core.models.base import Base, created_at_column


class EpisodeRegrade(Base):
    __tablename__ = "episode_regrades"
    __table_args__ = (Index(None, "run_id", "episode_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"))
    grader: Mapped[str] = mapped_column(String(64))
    """Which grader: a digest of the grading code that produced this verdict."""
    reward: Mapped[float] = mapped_column(Float)
    reward_components: Mapped[dict[str, Any]] = mapped_column(default=dict)
    verifier_layers: Mapped[list[Any]] = mapped_column(default=list)
    flags: Mapped[list[str]] = mapped_column(ARRAY(String(32)), default=list)
    previous_reward: Mapped[float | None] = mapped_column(Float)
    """The episode's stored reward when it was re-graded (what the trainer saw)."""
    created_at: Mapped[datetime] = created_at_column()
