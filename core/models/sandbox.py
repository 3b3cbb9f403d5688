"""Sandbox lifecycle events (create, pull, acquire, reset, retire, destroy, reap, oom, timeout…) and the
catalogue of sandbox images pushed to a registry."""

from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from core.models.base import Base, created_at_column


class SandboxEvent(Base):
    __tablename__ = "sandbox_events"
    __table_args__ = (Index(None, "sandbox_id", "id"), Index(None, "episode_id"), Index(None, "kind", "created_at"))

    id: Mapped[int] = mapped_column(primary_key=True)
    sandbox_id: Mapped[str] = mapped_column(String(64))
    container_id: Mapped[str | None] = mapped_column(String(80))
    kind: Mapped[str] = mapped_column(String(32))
    worker: Mapped[str | None] = mapped_column(String(128))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    episode_id: Mapped[int | None] = mapped_column(ForeignKey("episodes.id", ondelete="SET NULL"))
    duration_ms: Mapped[float | None] = mapped_column(Float)
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = created_at_column()


class SandboxImage(Base):
    """A sandbox image pushed to a registry (`crucible images push`): a worker host that lacks `image` pulls
    `repository@digest` from that registry, as it reaches it, so that it runs the very bytes that were pushed."""

    __tablename__ = "sandbox_images"

    image: Mapped[str] = mapped_column(String(512), primary_key=True)
    """The local name a sandbox spec uses (`crucible/code-repo:d3d1fd99dc47`)."""
    pushed_to: Mapped[str] = mapped_column(String(512))
    """The address it was pushed to (`host:port[/path]`), as the pushing host reached it."""
    repository: Mapped[str] = mapped_column(String(512))
    """Its repository in that registry (`crucible/code-repo`)."""
    digest: Mapped[str] = mapped_column(String(80))
    pushed_at: Mapped[datetime] = created_at_column()
