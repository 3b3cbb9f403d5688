"""Celery tasks. Thin: take ids, call a service, map errors to retries."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from core.db import session_scope
from core.settings import get_settings
from core.termination import TerminationReason
from task_workers import heartbeat
from task_workers.episode.errors import InfrastructureFault
from task_workers.episode.group_judge import judge_after_failure
from task_workers.episode.persist import record_fault
from task_workers.episode.runner import run_episode

logger = logging.getLogger(__name__)

# The agent loop enforces each environment's episode_timeout itself; these limits only catch a
# task that hangs outside it (the hard limit kills the thread's work, acks_late redelivers).
SOFT_TIME_LIMIT_S = 3600
TIME_LIMIT_S = 3700
MAX_RETRIES = 3


@shared_task(name="crucible.ping", time_limit=30)
def ping() -> dict[str, object]:
    """Liveness probe: answers with the worker's host and pid."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


@shared_task(
    name="crucible.run_episode", bind=True, acks_late=True, reject_on_worker_lost=True,
    max_retries=MAX_RETRIES, soft_time_limit=SOFT_TIME_LIMIT_S, time_limit=TIME_LIMIT_S,
)
def run_episode_task(self: Any, episode_id: int) -> dict[str, Any]:
    from task_workers.context import worker_context

    worker = get_settings().worker_name
    context = worker_context()
    try:
        outcome = run_episode(episode_id, policy=context.policy, sandboxes=context.sandboxes, worker=worker,
                              incarnation=heartbeat.announced(), pools=context.pool)
    except (InfrastructureFault, SoftTimeLimitExceeded) as fault:
        reason = getattr(fault, "reason", TerminationReason.WORKER_LOST)
        final = self.request.retries >= MAX_RETRIES or not getattr(fault, "retry", True)
        logger.warning("episode %s: %s (%s); %s", episode_id, reason, fault, "giving up" if final else "retrying")
        with session_scope() as session:
            record_fault(session, episode_id=episode_id, reason=reason, message=str(fault), worker=worker,
                         final=final)
        if final:
            judge_after_failure(episode_id, worker=worker)  # if it was its pairwise group's last one out
            return {"episode_id": episode_id, "stored": False, "failed": reason.value}
        raise self.retry(exc=fault, countdown=min(2**self.request.retries, 30)) from fault
    return {"episode_id": outcome.episode_id, "stored": outcome.stored,
            "termination": outcome.termination, "reward": outcome.reward}
