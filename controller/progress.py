"""How far a run has got: its groups and episodes by status, and the public view of a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Environment, Episode, EpisodeGroup, Run, RunEnvironment
from core.termination import GroupStatus

__all__ = ["GroupStatus", "RunProgress", "describe_run", "run_progress"]


@dataclass(frozen=True)
class RunProgress:
    groups: dict[str, int]
    """Groups of the run by status."""
    drop_reasons: dict[str, int] = field(default_factory=dict)
    """Dropped groups by reason (core.termination.DropReason; "unknown" for ones dropped before 0011)."""

    @property
    def dispatched(self) -> int:
        return sum(self.groups.values())

    @property
    def replaced(self) -> int:
        """Dropped groups, whatever the reason: none will be trained on, so each frees its admission slot
        and the controller replaces it (controller.dispatch.allowance). A stale-cap drop too: held for good,
        η·B of them would leave the run synchronous (issue 47)."""
        return self.groups.get(GroupStatus.DROPPED, 0)

    @property
    def inflight(self) -> int:
        return self.groups.get(GroupStatus.RUNNING, 0)

    @property
    def awaiting_trainer(self) -> int:
        return self.groups.get(GroupStatus.COMPLETE, 0)


def run_progress(session: Session, *, run_id: int) -> RunProgress:
    rows = session.execute(
        select(EpisodeGroup.status, EpisodeGroup.drop_reason, func.count()).where(EpisodeGroup.run_id == run_id)
        .group_by(EpisodeGroup.status, EpisodeGroup.drop_reason)
    ).all()
    groups: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for status, reason, count in rows:
        groups[status] = groups.get(status, 0) + count
        if status == GroupStatus.DROPPED:
            reasons[reason or "unknown"] = reasons.get(reason or "unknown", 0) + count
    return RunProgress(groups=groups, drop_reasons=reasons)


def episode_counts(session: Session, *, run_id: int) -> dict[str, int]:
    rows = session.execute(
        select(Episode.status, func.count()).where(Episode.run_id == run_id).group_by(Episode.status)
    ).all()
    return {status: count for status, count in rows}


def run_environments(session: Session, *, run_id: int) -> list[tuple[Environment, float]]:
    """The run's pinned environment versions and weights, by name."""
    rows = session.execute(
        select(Environment, RunEnvironment.weight)
        .join(RunEnvironment, RunEnvironment.environment_id == Environment.id)
        .where(RunEnvironment.run_id == run_id)
        .order_by(Environment.name)
    ).all()
    return [(env, weight) for env, weight in rows]


def _groups_view(progress: RunProgress) -> dict[str, Any]:
    return {"groups": progress.groups, "dropped_by_reason": progress.drop_reasons}


def describe_run(session: Session, run: Run, *, detail: bool = False) -> dict[str, Any]:
    """The run as the CLI and API show it; `detail` adds episode counts and the resolved config."""
    view: dict[str, Any] = {
        "id": run.id, "name": run.name, "status": run.status, "purpose": run.purpose, "model": run.model,
        "mode": run.mode, "group_size": run.group_size, "batch_size": run.batch_size,
        "max_staleness": run.max_staleness, "policy_version": run.policy_version, "sync_error": run.sync_error,
        "environments": [
            {"name": env.name, "version": env.version, "kind": env.kind, "weight": weight}
            for env, weight in run_environments(session, run_id=run.id)
        ],
        **_groups_view(run_progress(session, run_id=run.id)),
        "created_at": run.created_at, "started_at": run.started_at, "finished_at": run.finished_at,
    }
    if detail:
        view["episodes"] = episode_counts(session, run_id=run.id)
        view["config"] = run.config
    return view
