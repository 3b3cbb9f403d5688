"""Files an episode's observations produced besides their text (a browser's screenshots, the opening
observation), one row per file, tied to the turn that produced it.

The caps and the allow-list of media types live here, in one place: the worker screens artifacts
against them before storing (task_workers.episode.artifacts), the API serves only these media types,
and the table refuses any other.
"""

from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from core.models.base import Base, created_at_column

ARTIFACT_MEDIA_TYPES = ("image/png", "image/jpeg", "text/plain")
"""What may be stored and served: never HTML, SVG or anything else a browser would run."""
MAX_ARTIFACT_BYTES = 4 * 1024 * 1024
"""One artifact: a full-page screenshot is a few hundred KiB."""
MAX_EPISODE_ARTIFACT_BYTES = 64 * 1024 * 1024
"""All the artifacts of one episode together."""
MAX_EPISODE_ARTIFACTS = 2048
"""Rows per episode (1000 turns at most, a screenshot and a note each): the list route is not paged."""
MAX_ARTIFACT_NAME = 64
"""Characters of `name` and of `media_type` (their columns' width)."""

_MEDIA_TYPES = ", ".join(f"'{media_type}'" for media_type in ARTIFACT_MEDIA_TYPES)


class EpisodeArtifact(Base):
    __tablename__ = "episode_artifacts"
    __table_args__ = (
        Index(None, "episode_id"),
        CheckConstraint(f"media_type IN ({_MEDIA_TYPES})", name="media_type_allowed"),
        CheckConstraint("size = octet_length(data)", name="size_matches_data"),
        CheckConstraint("turn_index IS NULL OR turn_index >= 0", name="turn_index_non_negative"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"))
    turn_index: Mapped[int | None] = mapped_column(Integer)
    """The turn whose observation produced it; None for the opening observation, before the first turn."""
    name: Mapped[str] = mapped_column(String(MAX_ARTIFACT_NAME))
    """What it is: `screenshot`, `observation` (the opening text), `not_stored` (why one was dropped)."""
    media_type: Mapped[str] = mapped_column(String(MAX_ARTIFACT_NAME))
    size: Mapped[int] = mapped_column(Integer)
    """Bytes of `data`, so that lists never read the data itself."""
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    created_at: Mapped[datetime] = created_at_column()
