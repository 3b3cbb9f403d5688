"""What `/metrics` exposes besides request counters: the store's state, read at scrape time.

    crucible_runs{status}                               runs by status
    crucible_run_policy_version{run}                    active runs' current policy version
    crucible_run_episodes{run, status}                  active runs' episodes by status
    crucible_run_training_step{run}                     active runs' latest training step
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Episode, Run, TrainingStep
from core.termination import RunStatus

ACTIVE = (RunStatus.PENDING, RunStatus.RUNNING)


class StoreCollector(Collector):
    """A prometheus_client collector that queries the store on every scrape (a few indexed counts)."""

    def __init__(self, session_scope: Callable[[], AbstractContextManager[Session]]) -> None:
        self._scope = session_scope

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily("crucible_runs", "Runs by status.", labels=["status"])
        version = GaugeMetricFamily("crucible_run_policy_version", "Current policy version of active runs.",
                                    labels=["run"])
        episodes = GaugeMetricFamily("crucible_run_episodes", "Episodes of active runs by status.",
                                     labels=["run", "status"])
        steps = GaugeMetricFamily("crucible_run_training_step", "Latest training step of active runs.", labels=["run"])
        with self._scope() as session:
            for status, count in session.execute(select(Run.status, func.count()).group_by(Run.status)):
                runs.add_metric([status], count)
            active = list(session.execute(select(Run.id, Run.policy_version).where(Run.status.in_(ACTIVE))))
            ids = [run_id for run_id, _ in active]
            for run_id, policy_version in active:
                version.add_metric([str(run_id)], policy_version)
            by_status = select(Episode.run_id, Episode.status, func.count()).where(Episode.run_id.in_(ids))
            for run_id, status, count in session.execute(by_status.group_by(Episode.run_id, Episode.status)):
                episodes.add_metric([str(run_id), status], count)
            latest = select(TrainingStep.run_id, func.max(TrainingStep.step)).where(TrainingStep.run_id.in_(ids))
            for run_id, step in session.execute(latest.group_by(TrainingStep.run_id)):
                steps.add_metric([str(run_id)], step)
        yield from (runs, version, episodes, steps)
