"""`/v1/runs`: launch from a RunConfig, list, show with summary counts, stop, resume, metrics, stats."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.deps import SessionDep, current_token
from api.pagination import DEFAULT_LIMIT, Cursor, Limit
from api.params import RunId
from api.schemas.common import ERROR_RESPONSES, MUTATION_RESPONSES
from api.schemas.evals import CheckpointComparison, EvalReport
from api.schemas.runs import RunDetail, RunGrading, RunMetrics, RunPublic, RunsPublic, RunStaleness, RunStats
from api.services import run_charts, run_eval, run_grading, run_staleness, run_stats, runs
from core.schemas import RunConfig
from core.termination import RunPurpose, RunStatus

MaxPoints = Annotated[int, Query(
    ge=2, le=run_charts.MAX_POINTS,
    description="Most training steps to chart (the first and the latest always among them); a run with more is "
                "charted at every `stride`-th step.")]

router = APIRouter(prefix="/v1/runs", tags=["runs"], dependencies=[Depends(current_token)], responses=ERROR_RESPONSES)


@router.post("", status_code=201, response_model=RunPublic, responses=MUTATION_RESPONSES)
def launch_run(config: RunConfig, session: SessionDep) -> RunPublic:
    """Launch a run: environment versions are pinned and the resolved config stored; it starts pending."""
    run = runs.launch(session, config=config)
    session.commit()
    return run


@router.get("", response_model=RunsPublic)
def list_runs(
    session: SessionDep, status: RunStatus | None = None, purpose: RunPurpose | None = None,
    cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT,
) -> RunsPublic:
    """Runs, newest first."""
    data, next_cursor = runs.list_runs(session, status=status, purpose=purpose, cursor=cursor, limit=limit)
    return RunsPublic(data=data, next_cursor=next_cursor)


@router.get("/{run_id}", response_model=RunDetail)
def show_run(run_id: RunId, session: SessionDep) -> RunDetail:
    """One run with its resolved config, pinned environments and summary counts."""
    return runs.show(session, run_id=run_id)


@router.post("/{run_id}/stop", response_model=RunPublic, responses=MUTATION_RESPONSES)
def stop_run(run_id: RunId, session: SessionDep) -> RunPublic:
    """Stop dispatching (episodes in flight finish). Idempotent."""
    run = runs.stop(session, run_id=run_id)
    session.commit()
    return run


@router.post("/{run_id}/resume", response_model=RunPublic, responses=MUTATION_RESPONSES)
def resume_run(run_id: RunId, session: SessionDep) -> RunPublic:
    """Make a stopped run active again. Idempotent."""
    run = runs.resume(session, run_id=run_id)
    session.commit()
    return run


@router.get("/{run_id}/metrics", response_model=RunMetrics)
def show_run_metrics(
    run_id: RunId, session: SessionDep, max_points: MaxPoints = run_charts.DEFAULT_MAX_POINTS
) -> RunMetrics:
    """Training-step metrics and per-step (or per-version) aggregates of the ended episodes, for at most
    `max_points` evenly strided steps."""
    return run_charts.metrics(session, run_id=run_id, max_points=max_points)


@router.get("/{run_id}/stats", response_model=RunStats)
def show_run_stats(run_id: RunId, session: SessionDep) -> RunStats:
    """Staleness histogram, throughput per minute and where the time goes."""
    return run_stats.stats(session, run_id=run_id)


@router.get("/{run_id}/eval", response_model=EvalReport)
def show_run_eval(run_id: RunId, session: SessionDep) -> EvalReport:
    """pass@1 and pass@k with 95 % intervals over tasks, overall, per environment and per difficulty bucket
    (made for eval runs: `crucible eval launch`; any run's ended episodes can be counted)."""
    return run_eval.eval_report(session, run_id=run_id)


@router.get("/{run_id}/checkpoint-evals", response_model=CheckpointComparison)
def show_checkpoint_evals(run_id: RunId, session: SessionDep) -> CheckpointComparison:
    """The evaluations of a training run's checkpoints (`crucible eval launch --run ID --step S`), by step:
    each eval run's report, pass@1 and pass@k with 95 % intervals."""
    return run_eval.checkpoint_evals(session, run_id=run_id)


@router.get("/{run_id}/staleness", response_model=RunStaleness)
def show_run_staleness(run_id: RunId, session: SessionDep) -> RunStaleness:
    """Dropped groups by reason, the trained tokens' version lags and masked fraction, and the trained
    tasks' mean episode seconds beside the dispatched ones' (the length-bias check)."""
    return run_staleness.staleness(session, run_id=run_id)


@router.get("/{run_id}/grading", response_model=RunGrading)
def show_run_grading(run_id: RunId, session: SessionDep) -> RunGrading:
    """The share of hidden-test grades that were blinded, and the episodes and training steps whose reward
    a re-grade (`crucible episodes regrade`) changed."""
    return run_grading.grading(session, run_id=run_id)
