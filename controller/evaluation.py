"""Evaluation runs: k samples of every task of an environment's held-out split, under one model.

    run = launch_eval(session, model="/models/tiny", environment="fix-bugs", samples_per_task=4)
    # … the controller dispatches one group of k per task (the least-used pick covers each task once);
    # api.services.run_eval.eval_report(session, run_id=run.id) then gives pass@1 and pass@k with
    # their 95 % intervals, overall, per environment and per difficulty bucket.

An eval run is never trained on (purpose `eval`: no staleness bound, no trainer). Its seed fixes which
sampling seeds its episodes get, so two evaluations of one model with one seed draw the same tasks in
the same order.

A training run's checkpoint at any kept step (`crucible eval launch --run R --step S`): `recorded_step`
finds the step and the version the trainer published it as, `check_servers_free` refuses while anything
else could load weights, trainer.checkpoint_eval loads the checkpoint into every policy server under a
label of the evaluation's own (core.versions.checkpoint_tag), then `launch_eval(..., checkpoint=...)`
records it: the workers store no turn of the run sampled under another label (task_workers.episode.runner).
"""

from __future__ import annotations

import re
import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.errors import InvalidRunState
from controller.pass_rate import EVERY_TASK
from controller.picking import check_eligible
from controller.runs import create_run, get_run
from core.db import live_trainers
from core.errors import ConfigError, NotFound
from core.models import PolicyVersion, Run, Task
from core.schemas import EnvironmentShare, RunConfig
from core.schemas.run import CheckpointRef, RecordedStep
from core.termination import RunPurpose, RunStatus

DEFAULT_SPLIT = "test"


def recorded_step(session: Session, *, run_id: int, step: int) -> RecordedStep:
    """Step `step` of training run `run_id`: NotFound when the run or the step is unknown, ConfigError for
    a run that is not a training run. Whether the checkpoint is still on disk is trainer.checkpoint_eval's
    check (the trainer keeps the newest `keep_checkpoints` and every `keep_every`-th)."""
    run = get_run(session, run_id=run_id)
    if run.purpose != RunPurpose.TRAIN:
        raise ConfigError(f"--run: expected a training run, got run {run_id} of purpose {run.purpose}")
    if step == 0:
        return RecordedStep(ref=CheckpointRef(run_id=run_id, step=0, version=0), model=run.model, checkpoint_path=None)
    row = session.execute(select(PolicyVersion).where(PolicyVersion.run_id == run_id, PolicyVersion.training_step == step)
                          .order_by(PolicyVersion.version.desc()).limit(1)).scalar_one_or_none()
    if row is None:
        steps = session.execute(select(func.min(PolicyVersion.training_step), func.max(PolicyVersion.training_step))
                                .where(PolicyVersion.run_id == run_id)).one()
        recorded = "none" if steps[0] is None else f"{steps[0]} to {steps[1]}"
        raise NotFound(f"--step: run {run_id} recorded no training step {step} (its steps: {recorded}; 0 is its "
                       "starting weights)")
    return RecordedStep(ref=CheckpointRef(run_id=run_id, step=step, version=row.version), model=run.model,
                        checkpoint_path=row.checkpoint_path)


def check_servers_free(session: Session) -> None:
    """InvalidRunState while anything may load other weights into the policy servers a checkpoint's
    evaluation loads: a training run pending or running, a trainer process alive (a stopped run's trainer
    still re-syncs its own weights), or another checkpoint's evaluation not ended."""
    active = [RunStatus.PENDING, RunStatus.RUNNING]
    training = session.execute(select(Run.id, Run.name, Run.status).where(
        Run.purpose == RunPurpose.TRAIN, Run.status.in_(active)).order_by(Run.id).limit(5)).all()
    if training:
        named = ", ".join(f"{run_id} ({name}, {status})" for run_id, name, status in training)
        raise InvalidRunState(f"training runs {named} may push their weights to the policy servers a checkpoint's "
                              "evaluation loads: stop them and their trainers first (`crucible run stop ID`), or "
                              "evaluate a model directory on servers of its own")
    if trainers := live_trainers(session):
        raise InvalidRunState(f"trainer processes of runs {', '.join(map(str, trainers[:5]))} are alive: a trainer "
                              "re-syncs its weights to the policy servers even while its run is stopped; end them first")
    evaluating = session.execute(select(Run.id, Run.name).where(
        Run.purpose == RunPurpose.EVAL, Run.status.in_(active),
        func.jsonb_typeof(Run.config["checkpoint"]) == "object").order_by(Run.id).limit(5)).all()
    if evaluating:
        named = ", ".join(f"{run_id} ({name})" for run_id, name in evaluating)
        raise InvalidRunState(f"eval runs {named} evaluate a checkpoint the policy servers serve: let them end (or "
                              "`crucible run stop ID`) before loading another")


def launch_eval(
    session: Session, *, model: str, environment: str, samples_per_task: int, split: str = DEFAULT_SPLIT,
    version: int | None = None, seed: int = 0, name: str | None = None, max_inflight_groups: int = 16,
    checkpoint: CheckpointRef | None = None,
) -> Run:
    """A run of purpose `eval`: one group of `samples_per_task` episodes per task of the split. Flushes.
    `checkpoint`: the training checkpoint the caller has just loaded into the policy servers."""
    if checkpoint is not None:
        if checkpoint.tag is None:
            raise ConfigError("checkpoint.tag: expected the label its weights were loaded under "
                              "(trainer.checkpoint_eval.serve_checkpoint), got none")
        check_servers_free(session)
    check_eligible(session, environment_name=environment, split=split, curriculum=EVERY_TASK)
    tasks = session.execute(
        select(func.count()).where(Task.environment_name == environment, Task.split == split)
    ).scalar_one()
    of = f"-run{checkpoint.run_id}-step{checkpoint.step}" if checkpoint is not None else ""
    default_name = re.sub(r"[^A-Za-z0-9._-]", "-", f"eval{of}-{environment}-{split}")[:110]
    config = RunConfig(
        name=name or f"{default_name}-{uuid.uuid4().hex[:8]}", model=model, purpose=RunPurpose.EVAL, split=split,
        environments=[EnvironmentShare(name=environment, version=version)], group_size=samples_per_task,
        batch_size=1, max_groups=tasks, max_inflight_groups=min(tasks, max_inflight_groups), curriculum=EVERY_TASK,
        seed=seed, checkpoint=checkpoint,
    )
    return create_run(session, config=config, checkpoint_loaded=checkpoint is not None)
