"""Which training run's trainer holds a policy server: one at a time.

Every training run numbers its versions 0, 1, 2, …, and its trainer re-pushes its own weights to any
replica that serves something else. Two trainers on one pool would push over each other: the replicas
alternate between two models and each run samples with the other's weights. Labels name their run
(core.versions) so that a worker never stores such a turn; this refuses the setup before it starts: a
training run is not launched, and a trainer does not start, on a server that a live trainer of another
run holds (its advisory lock, core.db.live_trainers), and a trainer does not push to a server whose
label names another run with a live trainer (`held_by`: the evidence is the server's own label, so
another spelling of its address or a `--policy-url` outside the run's pool is caught too). A run names
its own servers with `policy_urls`, among the servers the operator lists (`allowed_pool`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import live_trainers
from core.errors import ConfigError, CrucibleError
from core.models import Run
from core.schemas.run import stored_run
from core.settings import get_settings, same_servers


class PoolHeld(CrucibleError):
    """A policy server that a live trainer of another run holds (the API answers 409)."""


def check_pool_free(session: Session, *, urls: Sequence[str], run_id: int | None = None) -> None:
    """PoolHeld when a live trainer of a run other than `run_id` holds one of `urls` (by its run's
    pool); trainer.sync.Publisher also refuses a server whose label names such a run."""
    others = [run for run in live_trainers(session) if run != run_id]
    if not others:
        return
    for other, config in session.execute(select(Run.id, Run.config).where(Run.id.in_(others)).order_by(Run.id)):
        if shared := same_servers(stored_run(config, run_id=other).pool, urls):
            raise PoolHeld(
                f"policy servers {', '.join(shared[:3])} are held by the live trainer of run {other}: a second "
                "training run there would sample with that run's weights; give this run servers of its own "
                "(policy_urls) or stop run "
                f"{other}'s trainer first")


def held_by(session: Session, runs: Sequence[int], *, run_id: int) -> list[int]:
    """Which of `runs` (named by servers' labels) other than `run_id` have a live trainer."""
    others = set(runs) - {run_id}
    return sorted(set(live_trainers(session)) & others) if others else []


def allowed_pool(urls: Sequence[str]) -> None:
    """ConfigError unless every server of `urls` is the platform's (CRUCIBLE_POLICY_URLS) or one the
    operator lists for runs of their own (CRUCIBLE_POLICY_SERVERS): a run config must not point workers
    and a trainer at any address a user types."""
    unknown = [url for url in urls if not get_settings().allows_policy_server(url)]
    if unknown:
        raise ConfigError(f"policy_urls: expected servers of CRUCIBLE_POLICY_URLS or CRUCIBLE_POLICY_SERVERS, got "
                          f"{', '.join(unknown[:3])}")
