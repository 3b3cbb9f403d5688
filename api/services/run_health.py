"""Why a run is not moving, in words: today, a train run whose groups wait for a trainer nobody started.

A `purpose: train` run only advances when a trainer consumes its complete groups; the controller stops
dispatching once the version bound is reached, so without a trainer the run stays `running` forever.
Whether a trainer is attached is not guessed from timings: every trainer holds the run's Postgres
advisory lock for its whole life (trainer.store.hold_trainer_lock), and a killed trainer's connection
drops and releases it. So: a running train run with complete groups and no holder of that lock is
waiting for a trainer, and says so in its run view (`GET /v1/runs/{id}`, `crucible run follow`).
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db import live_trainers
from core.models import EpisodeGroup, Run
from core.termination import GroupStatus, RunPurpose, RunStatus


def trainer_attached(session: Session, *, run_id: int) -> bool:
    """True while a trainer process holds the run's trainer lock."""
    return bool(live_trainers(session, run_id=run_id))


def waiting_for_trainer(session: Session, *, run: Run) -> str | None:
    """A note when the run's complete groups wait for a trainer that is not running, else None."""
    if run.purpose != RunPurpose.TRAIN or run.status != RunStatus.RUNNING:
        return None
    complete = session.scalar(
        select(func.count()).where(EpisodeGroup.run_id == run.id, EpisodeGroup.status == GroupStatus.COMPLETE)
    ) or 0
    if complete == 0 or trainer_attached(session, run_id=run.id):
        return None
    plural = "group waits" if complete == 1 else "groups wait"
    return (f"waiting for a trainer: {complete} complete {plural} (a step takes {run.batch_size}) and no trainer "
            f"is attached; start one with `crucible trainer --run {run.id}`")
