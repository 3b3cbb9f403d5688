"""Runs: create (pinning environment versions), stop, resume, look up, list.

A run is *active* while pending (nothing dispatched yet) or running; only active runs are dispatched
and reconciled. Services flush; the caller commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.config import JOB_KEY
from controller.errors import InvalidRunState
from controller.logs import log_event
from controller.picking import check_eligible
from core.errors import ConfigError, NotFound
from core.models import Environment, Run, RunEnvironment
from core.pools import allowed_pool, check_pool_free
from core.schemas import EnvironmentShare, RunConfig
from core.schemas.run import token_staleness_bound
from core.termination import RunPurpose, RunStatus
from environments.service import get_environment

ACTIVE_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING)


def resolve_config(config: RunConfig, pinned: list[Environment]) -> RunConfig:
    """The config with every default made explicit: versions pinned, the effective staleness bound
    (0 in sync mode), the token staleness mask's bound and the in-flight target."""
    staleness = config.staleness_bound
    shares = [
        EnvironmentShare(name=env.name, version=env.version, weight=share.weight)
        for share, env in zip(config.environments, pinned, strict=True)
    ]
    inflight = config.max_inflight_groups or (staleness + 1) * config.batch_size
    # Normalisation is decided for the run (how many environments it mixes), never per batch.
    loss = config.trainer.loss
    normalization = loss.normalization_for(environments=len(pinned))
    trainer = config.trainer.model_copy(
        update={"loss": loss.model_copy(update={"normalize_rewards_per_environment": normalization}),
                "seed": config.seed if config.trainer.seed is None else config.trainer.seed})
    return config.model_copy(
        update={"environments": shares, "max_staleness": staleness, "max_inflight_groups": inflight,
                "max_token_staleness": token_staleness_bound(staleness, config.max_token_staleness),
                "trainer": trainer}
    )


def _pin_environments(session: Session, config: RunConfig) -> list[Environment]:
    names = [share.name for share in config.environments]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"environments: expected each environment once, got {', '.join(duplicates)} twice")
    pinned = [get_environment(session, name=share.name, version=share.version) for share in config.environments]
    for env in pinned:
        check_eligible(session, environment_name=env.name, split=config.split, curriculum=config.curriculum)
    return pinned


def create_run(
    session: Session, *, config: RunConfig, job: Mapping[str, Any] | None = None, checkpoint_loaded: bool = False,
) -> Run:
    """Create a pending run from `config`; `job` is stored beside it (e.g. a pass-rate job's threshold).
    A config naming a checkpoint is refused unless `checkpoint_loaded` (controller.evaluation.launch_eval,
    once the checkpoint serves): a run may not claim weights nobody loaded.

    Raises NotFound for an unknown environment or version, NoEligibleTask when an environment has no
    task the run could draw, ConfigError for a taken name, PoolHeld for a training run on policy servers
    another run's live trainer holds (core.pools).
    """
    if config.checkpoint is not None and not checkpoint_loaded:
        raise ConfigError("checkpoint: expected none in a run config (`crucible eval launch --run R --step S` "
                          f"sets it once it has loaded the checkpoint into the policy servers), got {config.checkpoint}")
    existing = session.execute(select(Run.id).where(Run.name == config.name)).scalar_one_or_none()
    if existing is not None:
        raise ConfigError(f"name: a run named {config.name!r} exists (id {existing}); choose another name")
    if config.policy_urls is not None:
        allowed_pool(config.policy_urls)
    if config.purpose == RunPurpose.TRAIN:
        check_pool_free(session, urls=config.policy_pool)
    pinned = _pin_environments(session, config)
    resolved = resolve_config(config, pinned)
    stored = resolved.model_dump(mode="json") | ({JOB_KEY: dict(job)} if job else {})
    run = Run(
        name=resolved.name, status=RunStatus.PENDING, purpose=resolved.purpose, model=resolved.model,
        mode=resolved.mode, group_size=resolved.group_size, batch_size=resolved.batch_size,
        max_staleness=resolved.max_staleness, policy_version=0, config=stored,
    )
    session.add(run)
    session.flush()
    session.add_all(
        RunEnvironment(run_id=run.id, environment_id=env.id, weight=share.weight)
        for env, share in zip(pinned, resolved.environments, strict=True)
    )
    session.flush()
    log_event("run.created", run_id=run.id, name=run.name, config=stored)
    return run


def get_run(session: Session, *, run_id: int, lock: bool = False) -> Run:
    query = select(Run).where(Run.id == run_id).execution_options(populate_existing=True)
    run = session.execute(query.with_for_update() if lock else query).scalar_one_or_none()
    if run is None:
        raise NotFound(f"no run with id {run_id}; `crucible run ls` lists the runs")
    return run


def list_runs(session: Session, *, status: str | None = None, limit: int = 100) -> list[Run]:
    """Newest first."""
    query = select(Run).order_by(Run.id.desc()).limit(limit)
    if status is not None:
        query = query.where(Run.status == status)
    return list(session.execute(query).scalars())


def active_run_ids(session: Session) -> list[int]:
    query = select(Run.id).where(Run.status.in_(ACTIVE_STATUSES)).order_by(Run.id)
    return list(session.execute(query).scalars())


def stop_run(session: Session, *, run_id: int) -> Run:
    """Stop dispatching. Episodes already in flight finish; `resume_run` carries on. Idempotent."""
    run = get_run(session, run_id=run_id, lock=True)
    if run.status == RunStatus.STOPPED:
        return run
    if run.status not in ACTIVE_STATUSES:
        raise InvalidRunState(f"run {run.id} is {run.status}; only a pending or running run can be stopped")
    run.status = RunStatus.STOPPED
    session.flush()
    log_event("run.stopped", run_id=run.id)
    return run


def resume_run(session: Session, *, run_id: int) -> Run:
    """Make a stopped run active again. Idempotent on an active run."""
    run = get_run(session, run_id=run_id, lock=True)
    if run.status in ACTIVE_STATUSES:
        return run
    if run.status != RunStatus.STOPPED:
        raise InvalidRunState(f"run {run.id} is {run.status}; only a stopped run can be resumed")
    if run.archived_at is not None:  # its turns are in Parquet: the trainer and the API read Postgres for new ones
        raise InvalidRunState(f"run {run.id} is archived; `crucible runs restore {run.id}` before resuming it")
    run.status = RunStatus.RUNNING if run.started_at else RunStatus.PENDING
    session.flush()
    log_event("run.resumed", run_id=run.id, status=run.status)
    return run


def finish_run(session: Session, *, run: Run, status: RunStatus = RunStatus.COMPLETED) -> None:
    run.status = status
    run.finished_at = datetime.now(UTC)
    session.flush()
    log_event("run.finished", run_id=run.id, status=status)
