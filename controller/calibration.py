"""Calibration in one process: a pass-rate job whose episodes this process plays against a policy server
it is given, with no broker and no task worker.

    rates = calibrate(engine, environment="factory", policy=client, sandboxes=sandboxes, samples=4)

The job is an ordinary pass-rate run (controller/pass_rate.py): one group of `samples` episodes per task of
the split, each played by the worker's own episode runner (task_workers.episode.runner) in a sandbox of the
environment, graded by its verifier. When every group is complete the controller records each task's pass
rate and difficulty bucket: the bucket weights read them, and each later run seeds its [0.1, 0.9] band
from them. This process is the controller for the time it takes: it holds the leader lock, so it refuses
to start beside a running controller (that one would send the job's episodes to the broker's workers and
their policy).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sqlalchemy import Engine, select

from controller.config import ControllerConfig
from controller.dispatcher import EPISODE_TASK
from controller.errors import InvalidRunState
from controller.leader import LeaderLock
from controller.loop import Controller
from controller.pass_rate import DifficultyThresholds, launch_pass_rate_job
from controller.runs import stop_run
from core.db import session_scope
from core.models import Task
from core.termination import TerminationReason
from environments.service import get_environment
from task_workers import heartbeat
from task_workers.episode.errors import InfrastructureFault
from task_workers.episode.persist import record_fault
from task_workers.episode.runner import run_episode

WORKER = "calibrate"
POLL_S = 0.5


class _PlayHere:
    """A dispatcher that plays each episode it is sent on a thread of this process."""

    def __init__(self, play: Callable[[int], None], jobs: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="calibrate")
        self._play = play
        self._lock = threading.Lock()
        self.futures: list[tuple[int, Future[None]]] = []

    def send_task(self, name: str, args: Sequence[Any] | None = None, **_: Any) -> None:
        if name != EPISODE_TASK:
            return
        episode_id = int((args or [0])[0])
        with self._lock:
            if any(id_ == episode_id and not future.done() for id_, future in self.futures):
                return  # sent again while it waits or plays here: one play of it is enough
            self.futures.append((episode_id, self._executor.submit(self._play, episode_id)))

    def raise_failures(self) -> None:
        with self._lock:
            done = [future for _, future in self.futures if future.done()]
        for future in done:
            future.result()  # a bug in playing (not the agent's outcome, not an infrastructure fault) stops it

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def _episode_player(*, policy: Any, sandboxes: Any, worker: str) -> Callable[[int], None]:
    """How this process plays one episode: the worker's episode runner, an infrastructure fault recorded as
    a worker's last retry records it."""
    def play(episode_id: int) -> None:
        try:
            run_episode(episode_id, policy=policy, sandboxes=sandboxes, worker=worker,
                        incarnation=heartbeat.announced())
        except InfrastructureFault as fault:  # as a worker's last retry records it: excluded from the rate
            with session_scope() as session:
                record_fault(session, episode_id=episode_id, message=str(fault), worker=worker, final=True,
                             reason=getattr(fault, "reason", TerminationReason.WORKER_LOST))

    return play


def _launch_job(*, environment: str, policy: Any, samples: int, split: str, model: str | None, jobs: int,
                thresholds: DifficultyThresholds | None, success_threshold: float,
                component: str | None) -> tuple[int, int]:
    """Launch the pass-rate job (on the policy's own model unless `model` names one): (its run id, its tasks)."""
    with session_scope() as session:
        # Groups in flight: enough to keep `jobs` threads busy, no more, so that no episode waits in
        # this process's queue past the deadline the controller gave it.
        run = launch_pass_rate_job(session, environment=environment, samples_per_task=samples,
                                   model=model or policy.model(), split=split, thresholds=thresholds,
                                   success_threshold=success_threshold, component=component,
                                   max_inflight_groups=max(1, math.ceil(jobs / samples)))
        return run.id, run.config["max_groups"]


def _recorded_rates(*, environment: str, split: str) -> list[dict[str, Any]]:
    """Each task of the split with its recorded pass rate, samples and difficulty bucket, in id order."""
    with session_scope() as session:
        rows = session.execute(select(Task).where(Task.environment_name == environment, Task.split == split)
                               .order_by(Task.id)).scalars()
        return [{"task_id": t.id, "external_id": t.external_id, "pass_rate": t.pass_rate,
                 "samples": t.pass_rate_samples, "difficulty": t.difficulty} for t in rows]


def calibrate(engine: Engine, *, environment: str, policy: Any, sandboxes: Any, samples: int, split: str = "train",
              model: str | None = None, jobs: int = 2, thresholds: DifficultyThresholds | None = None,
              success_threshold: float = 1.0, component: str | None = None,
              progress: Callable[[str], None] = lambda _: None) -> tuple[int, list[dict[str, Any]]]:
    """Launch the job, play it here, and return (its run id, each task's recorded rate and bucket). If it
    stops before every group is complete (an error, Ctrl-C), its run is stopped: no one else plays the
    rest, and no rate is recorded from part of it."""
    name = f"{WORKER}-{socket.gethostname()}-{os.getpid()}"[:64]
    lock = LeaderLock(engine, name=name)
    if not lock.acquire():
        raise InvalidRunState("a controller is running on this database: it would send the job's episodes to the "
                              "task workers and their policy; stop it, or use `crucible run pass-rate` with them")
    beating: heartbeat.Heartbeat | None = None
    dispatcher: _PlayHere | None = None
    run_id: int | None = None
    finished = False
    try:
        with session_scope() as session:
            kind = get_environment(session, name=environment).kind
        # This process is the worker of these episodes for the controller's reconciliation: alive while it
        # beats, so an episode running past its deadline is slow here, not lost and sent again.
        beating = heartbeat.Heartbeat(name=name, queues=[kind])
        beating.start()
        dispatcher = _PlayHere(_episode_player(policy=policy, sandboxes=sandboxes, worker=name), jobs)
        run_id, tasks = _launch_job(environment=environment, policy=policy, samples=samples, split=split, model=model,
                                    jobs=jobs, thresholds=thresholds, success_threshold=success_threshold,
                                    component=component)
        progress(f"run {run_id}: {tasks} tasks × {samples} samples, {jobs} at a time")
        controller = Controller(engine=engine, dispatcher=dispatcher, settings=ControllerConfig(), name=name,
                                lock=lock, runs=[run_id])
        while not finished:
            report = controller.step()
            if not report.leader:
                raise InvalidRunState(f"run {run_id}: another controller took the lead; its workers play the rest")
            finished = run_id in report.finished
            dispatcher.raise_failures()
            if not finished:
                time.sleep(POLL_S)
    finally:
        if dispatcher is not None:
            dispatcher.close()
        if run_id is not None and not finished:
            with session_scope() as session:
                stop_run(session, run_id=run_id)
        if beating is not None:
            beating.stop()
        lock.release()
    return run_id, _recorded_rates(environment=environment, split=split)
