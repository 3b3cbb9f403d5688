"""Which training run's trainer holds a policy server: one at a time.

Every training run numbers its versions 0, 1, 2, …, and its trainer re-pushes its own weights to any
replica that serves something else. Two trainers on one pool would push over each other: the replicas
alternate between two models and each run samples with the other's weights. Labels name their run
(core.versions) so that a worker never stores such a turn; this refuses the setup before it starts: a
training run is not launched, and a trainer does not start, on a server that a live trainer of another
run holds (its advisory lock, core.db.live_trainers). A run names its own servers with `policy_urls`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.errors import InvalidRunState
from core.db import live_trainers
from core.models import Run
from core.schemas.run import stored_pool
from core.settings import same_servers


def check_pool_free(session: Session, *, urls: Sequence[str], run_id: int | None = None) -> None:
    """InvalidRunState when a live trainer of a run other than `run_id` holds one of `urls`."""
    others = [run for run in live_trainers(session) if run != run_id]
    if not others:
        return
    for other, config in session.execute(select(Run.id, Run.config).where(Run.id.in_(others)).order_by(Run.id)):
        if shared := same_servers(stored_pool(config, run_id=other), urls):
            raise InvalidRunState(
                f"policy servers {', '.join(shared[:3])} are held by the live trainer of run {other}: a second "
                "training run there would sample with that run's weights; give this run servers of its own "
                "(policy_urls) or stop run "
                f"{other}'s trainer first")
