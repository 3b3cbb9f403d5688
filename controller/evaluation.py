"""Evaluation runs: k samples of every task of an environment's held-out split, under one model.

    run = launch_eval(session, model="/models/tiny", environment="fix-bugs", samples_per_task=4)
    # … the controller dispatches one group of k per task (the least-used pick covers each task once);
    # api.services.run_eval.eval_report(session, run_id=run.id) then gives pass@1 and pass@k with
    # their 95 % intervals, overall, per environment and per difficulty bucket.

An eval run is never trained on (purpose `eval`: no staleness bound, no trainer). Its seed fixes which
sampling seeds its episodes get, so two evaluations of one model with one seed draw the same tasks in
the same order.
"""

from __future__ import annotations

import re
import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.pass_rate import EVERY_TASK
from controller.picking import check_eligible
from controller.runs import create_run
from core.models import Run, Task
from core.schemas import EnvironmentShare, RunConfig
from core.termination import RunPurpose

DEFAULT_SPLIT = "test"


def launch_eval(
    session: Session, *, model: str, environment: str, samples_per_task: int, split: str = DEFAULT_SPLIT,
    version: int | None = None, seed: int = 0, name: str | None = None, max_inflight_groups: int = 16,
) -> Run:
    """A run of purpose `eval`: one group of `samples_per_task` episodes per task of the split. Flushes."""
    check_eligible(session, environment_name=environment, split=split, curriculum=EVERY_TASK)
    tasks = session.execute(
        select(func.count()).where(Task.environment_name == environment, Task.split == split)
    ).scalar_one()
    default_name = re.sub(r"[^A-Za-z0-9._-]", "-", f"eval-{environment}-{split}")[:110]
    config = RunConfig(
        name=name or f"{default_name}-{uuid.uuid4().hex[:8]}", model=model, purpose=RunPurpose.EVAL, split=split,
        environments=[EnvironmentShare(name=environment, version=version)], group_size=samples_per_task,
        batch_size=1, max_groups=tasks, max_inflight_groups=min(tasks, max_inflight_groups), curriculum=EVERY_TASK,
        seed=seed,
    )
    return create_run(session, config=config)
