"""Dashboard pages: runs → run → group → episode (→ a turn's tokens), and an episode search page.

Pages render summaries server-side; charts and the token view are drawn in the browser from the
same `/v1` JSON the CLI uses, and a running run's page polls it every few seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, Response
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session

from api.dashboard.rendering import STATIC_DIR, render
from api.deps import CurrentToken, PageToken, SessionDep
from api.errors import crucible_status
from api.pagination import DEFAULT_LIMIT, Cursor
from api.params import EpisodeId, GroupId, RunId
from api.routes.episodes import episode_filters
from api.schemas.episodes import ArtifactPublic
from api.schemas.runs import RunDetail
from api.services import episodes, groups, run_eval, run_grading, run_staleness, runs, sandboxes
from api.services.episodes import EpisodeFilters
from api.services.metric_names import metric_names
from core.errors import CrucibleError
from core.flags import EpisodeFlag
from core.health import worker_hosts
from core.termination import EpisodeStatus, RunPurpose, TerminationReason

STATIC_FILES = {"app.css": "text/css", "charts.js": "text/javascript", "run.js": "text/javascript",
                "episode.js": "text/javascript", "live.js": "text/javascript",
                "artifacts.js": "text/javascript"}


class PageRoute(APIRoute):
    """A Crucible error on a page (an unknown id…) is an HTML page with its status, not JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except CrucibleError as error:
                status, code = crucible_status(error)
                return render(request, "error.html", {"status": status, "code": code, "message": str(error)},
                              status_code=status)

        return handle


router = APIRouter(route_class=PageRoute, include_in_schema=False)


class PageRedirect(Exception):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


def drop_empty_params(request: Request) -> None:
    """A filter form submits empty fields; redirect to the URL without them instead of a 422."""
    items = request.query_params.multi_items()
    if any(value == "" for _, value in items):
        kept = urlencode([(key, value) for key, value in items if value != ""])
        raise PageRedirect(request.url.path + (f"?{kept}" if kept else ""))


@router.get("/")
def runs_page(request: Request, session: SessionDep, _: PageToken, cursor: Cursor = None) -> Response:
    data, next_cursor = runs.list_runs(session, status=None, purpose=None, cursor=cursor, limit=DEFAULT_LIMIT)
    counts = runs.episode_counts(session, run_ids=[run.id for run in data])
    return render(request, "runs.html", {"runs": data, "counts": counts, "next_cursor": next_cursor,
                                         "hosts": worker_hosts(session)})


@router.get("/runs/{run_id}")
def run_page(request: Request, run_id: RunId, session: SessionDep, _: PageToken) -> Response:
    run = runs.show(session, run_id=run_id)
    recent_groups, _cursor = groups.list_groups(session, run_id=run_id, status=None, cursor=None, limit=12)
    recent, _cursor = episodes.list_episodes(session, filters=EpisodeFilters(run_id=run_id), cursor=None, limit=12)
    # The run as the page polls for it, serialised by the API's own schema; the charts' data (metrics,
    # stats) is fetched by run.js from /v1/runs/{id}/metrics and /stats, in parallel, on load; the metric
    # and stage names are /v1/metric-names' (the trainer's), so the script keeps no copy of them.
    charts = {"run": run.model_dump(mode="json"), "names": metric_names().model_dump()}
    return render(request, "run.html", {"run": run, "groups": recent_groups, "episodes": recent, "charts": charts,
                                        "reasons": list(TerminationReason),
                                        "grading": run_grading.grading(session, run_id=run_id),
                                        "staleness": run_staleness.staleness(session, run_id=run_id),
                                        "evaluation": _evaluation(session, run),
                                        "checkpoints": _checkpoints(session, run)})


def _evaluation(session: Session, run: RunDetail) -> dict[str, Any] | None:
    """An eval run's report and its table rows (all, each environment, each bucket); None for other runs."""
    if run.purpose != RunPurpose.EVAL:
        return None
    report = run_eval.eval_report(session, run_id=run.id)
    rows = [("all", report.overall), *((f"environment {name}", cell) for name, cell in report.by_environment.items()),
            *((f"bucket {name}", cell) for name, cell in report.by_bucket.items())]
    return {"report": report, "rows": rows}


CHART_W, CHART_H, CHART_PAD = 560, 220, 40


def _checkpoints(session: Session, run: RunDetail) -> dict[str, Any] | None:
    """A training run's checkpoint evaluations: the table's rows and an SVG chart of pass@1 against step,
    a series per (environments, split, k), each point with its 95 % interval; None for other runs."""
    if run.purpose != RunPurpose.TRAIN:
        return None
    evals = run_eval.checkpoint_evals(session, run_id=run.id).evals
    if not evals:
        return {"evals": [], "series": []}
    steps = sorted({point.step for point in evals})
    span = (steps[-1] - steps[0]) or 1
    width, height = CHART_W - 2 * CHART_PAD, CHART_H - 2 * CHART_PAD

    def x(step: int) -> float:
        return CHART_PAD + (width * (step - steps[0]) / span if len(steps) > 1 else width / 2)

    def y(rate: float) -> float:
        return CHART_PAD + height * (1 - rate)

    series: dict[str, list[dict[str, float | int]]] = {}
    for point in evals:
        rate = point.report.overall.pass_at_1
        if rate is None:
            continue
        label = f"{', '.join(point.report.environments)} · {point.report.split} · k = {point.report.k}"
        series.setdefault(label, []).append({"step": point.step, "x": x(point.step), "y": y(rate.value),
                                             "low": y(rate.low), "high": y(rate.high), "value": rate.value,
                                             "partial": point.report.overall.excluded + point.report.unfinished})
    return {"evals": evals, "width": CHART_W, "height": CHART_H, "pad": CHART_PAD,
            "steps": [{"step": step, "x": x(step)} for step in steps],
            "ticks": [{"label": f"{rate:.0%}", "y": y(rate)} for rate in (0.0, 0.5, 1.0)],
            "series": [{"label": label, "points": points, "path": " ".join(f"{p['x']:.1f},{p['y']:.1f}" for p in points)}
                       for label, points in series.items()]}


@router.get("/groups/{group_id}")
def group_page(request: Request, group_id: GroupId, session: SessionDep, _: PageToken) -> Response:
    group = groups.show_group(session, group_id=group_id)
    return render(request, "group.html", {"group": group})


@router.get("/episodes")
def episodes_page(
    request: Request, session: SessionDep, _: PageToken, _clean: Annotated[None, Depends(drop_empty_params)],
    filters: Annotated[EpisodeFilters, Depends(episode_filters)], cursor: Cursor = None,
) -> Response:
    data, next_cursor = episodes.list_episodes(session, filters=filters, cursor=cursor, limit=DEFAULT_LIMIT)
    return render(request, "episodes.html", {
        "episodes": data, "next_cursor": next_cursor, "filters": vars(filters),
        "statuses": list(EpisodeStatus), "reasons": list(TerminationReason), "flags": list(EpisodeFlag),
    })


@router.get("/episodes/{episode_id}")
def episode_page(request: Request, episode_id: EpisodeId, session: SessionDep, _: PageToken) -> Response:
    episode = episodes.show_episode(session, episode_id=episode_id)
    events, more_events = sandboxes.episode_events(session, episode_id=episode_id, kind=None, cursor=None, limit=500)
    commands = [event for event in events if event.kind in sandboxes.COMMAND_KINDS]
    artifacts = episodes.list_artifacts(session, episode_id=episode_id)  # metadata: the bytes load lazily
    turn_indexes = {turn.index for turn in episode.turns}
    by_turn: dict[int, list[ArtifactPublic]] = {}
    for artifact in artifacts:
        if artifact.turn_index in turn_indexes:
            by_turn.setdefault(artifact.turn_index, []).append(artifact)
    return render(request, "episode.html", {
        "episode": episode, "events": events, "more_events": more_events, "commands": commands,
        "opening": [a for a in artifacts if a.turn_index is None], "artifacts_by_turn": by_turn,
        "unplaced": [a for a in artifacts if a.turn_index is not None and a.turn_index not in turn_indexes],
        "tree_view": bool(artifacts),  # an episode with artifacts (a browser's) shows each observation collapsed
    })


@router.get("/static/{name}")
def static_file(name: str, _: CurrentToken) -> Response:
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        return Response(status_code=404)
    return FileResponse(STATIC_DIR / name, media_type=media_type, headers={"Cache-Control": "private, max-age=300"})
