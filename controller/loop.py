"""The controller loop: leader lock → for each active run: fold its counters, reconcile, dispatch, finish.

    crucible controller --poll 1.0        # or, in code:
    Controller(engine=get_engine(), dispatcher=celery_dispatcher()).run_forever(poll_s=1.0)

Only the leader (see `controller.leader`) does anything; the others poll for the lock. A failure in
one run is logged and does not stop the others.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from controller.config import ControllerConfig
from controller.dispatch import complete_run_if_done, dispatch_run
from controller.dispatcher import Dispatcher
from controller.leader import LeaderLock
from controller.logs import log_event
from controller.pass_rate import record_job_pass_rates
from controller.reconcile import reconcile_run
from controller.runs import active_run_ids, get_run
from core.counters import fold_if_long
from core.db import session_factory
from core.termination import RunPurpose

logger = logging.getLogger("crucible.controller")


@dataclass
class StepReport:
    leader: bool
    dispatched: dict[int, int] = field(default_factory=dict)
    """Groups dispatched per run."""
    resent: int = 0
    """Episodes sent again: never sent, lost, or awaiting their judge (controller/reconcile.py)."""
    orphaned: int = 0
    """Running episodes whose worker process was gone (controller/reconcile.py), lost at once."""
    failed: int = 0
    """Episodes given up: lost too often, or past their run's judge_patience_s."""
    finished: list[int] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)


class Controller:
    def __init__(
        self, *, engine: Engine, dispatcher: Dispatcher, settings: ControllerConfig | None = None,
        name: str | None = None, lock: LeaderLock | None = None, runs: Collection[int] | None = None,
    ) -> None:
        """`runs`: step only these (a calibration plays its own job, and no one else's); None: every active run."""
        self.engine, self.dispatcher = engine, dispatcher
        self.runs = None if runs is None else frozenset(runs)
        self.settings = settings or ControllerConfig()
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.lock = lock or LeaderLock(engine, name=self.name)
        self._sessions = session_factory(engine)
        self._reported_slow: dict[int, set[int]] = {}
        self._run_errors: dict[int, str] = {}

    def step(self) -> StepReport:
        """One pass. Returns what it did; does nothing unless this controller is the leader."""
        if not self.lock.acquire():
            return StepReport(leader=False)
        report = StepReport(leader=True)
        with self._sessions() as session:
            run_ids = [run_id for run_id in active_run_ids(session) if self.runs is None or run_id in self.runs]
        for run_id in run_ids:
            with self._sessions() as session:
                try:
                    self._step_run(session, run_id=run_id, report=report)
                except Exception as error:  # one broken run must not stop the others
                    session.rollback()
                    report.errors[run_id] = str(error)
                    logger.exception("run %s: pass failed", run_id)
        self._report_errors(report)
        if report.dispatched or report.resent or report.orphaned or report.failed or report.finished:
            log_event("controller.step", controller=self.name, dispatched=report.dispatched,
                      resent=report.resent, orphaned=report.orphaned, failed=report.failed, finished=report.finished)
        return report

    def _step_run(self, session: Session, *, run_id: int, report: StepReport) -> None:
        if fold_if_long(session, run_id=run_id):  # keep the run's counter ledgers short (core.counters)
            session.commit()  # release what the fold holds before reconcile and dispatch
        reconciled = reconcile_run(session, run_id=run_id, dispatcher=self.dispatcher, settings=self.settings)
        report.resent += len(reconciled.resent) + len(reconciled.rescoring)
        report.orphaned += len(reconciled.orphaned)
        report.failed += len(reconciled.failed) + len(reconciled.unscored)
        for episode_id in sorted(set(reconciled.slow) - self._reported_slow.get(run_id, set())):
            log_event("reconcile.slow", level=logging.WARNING, run_id=run_id, episode_id=episode_id)
        self._reported_slow[run_id] = set(reconciled.slow)  # logged once while it stays slow
        dispatched = dispatch_run(session, run_id=run_id, dispatcher=self.dispatcher, settings=self.settings)
        if dispatched.group_ids:
            report.dispatched[run_id] = len(dispatched.group_ids)
        if dispatched.error:
            report.errors[run_id] = dispatched.error
        if complete_run_if_done(session, run_id=run_id):
            if get_run(session, run_id=run_id).purpose == RunPurpose.PASS_RATE:
                record_job_pass_rates(session, run_id=run_id)  # same transaction: recorded iff completed
            report.finished.append(run_id)
        session.commit()

    def _report_errors(self, report: StepReport) -> None:
        """Log a run's error when it first appears or changes, not on every pass."""
        for run_id, error in report.errors.items():
            if self._run_errors.get(run_id) != error:
                log_event("controller.run_error", level=logging.ERROR, run_id=run_id, error=error)
        self._run_errors = dict(report.errors)

    def run_forever(self, poll_s: float = 1.0, *, stop: threading.Event | None = None) -> None:
        """Step every `poll_s` seconds until `stop` is set (or forever)."""
        stop = stop or threading.Event()
        log_event("controller.started", controller=self.name, poll_s=poll_s, settings=self.settings.model_dump())
        try:
            while not stop.is_set():
                try:
                    self.step()
                except SQLAlchemyError:  # the database is away: keep polling, the lock will tell
                    logger.exception("controller pass failed")
                stop.wait(poll_s)
        finally:
            self.close()

    def close(self) -> None:
        self.lock.release()
        log_event("controller.stopped", controller=self.name)
