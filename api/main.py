"""The FastAPI application: `/v1` REST, the dashboard, Prometheus `/metrics` and `/healthz`.

    crucible api --host 127.0.0.1 --port 8080      # then open http://127.0.0.1:8080/

Every route but `/healthz` needs an API token (`crucible token create NAME`). `crucible api` serves it
through `api.server`, which bounds request heads and connections; `api.limits` bounds bodies.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from api.dashboard import install_dashboard
from api.errors import install_error_handlers
from api.limits import BodyLimitMiddleware
from api.observability import ApiMetrics, MetricsMiddleware
from api.production import check_ready_to_serve
from api.routes import (
    environments,
    episodes,
    groups,
    health,
    meta,
    metric_names,
    policy,
    runs,
    sandboxes,
    tasks,
)
from core.settings import get_settings


def _check_production() -> None:
    from core.db import session_scope

    settings = get_settings()
    if settings.environment != "production":
        return
    with session_scope() as session:
        check_ready_to_serve(session, settings)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    await run_in_threadpool(_check_production)  # production without a live token never serves
    # What startup loaded (modules, routes, schemas: ~150k objects) never becomes garbage; frozen, the
    # collector stops walking it, which a full collection otherwise does inside whichever request
    # triggers it (~130 ms on these 2-core machines: the API's p95 at ten million turns, bench/api.py).
    gc.freeze()
    yield


def create_app() -> FastAPI:
    app = FastAPI(
        title="Crucible", version="0.1.0", openapi_url=None, docs_url=None, redoc_url=None, lifespan=_lifespan,
        description="RL for LLM agents in real sandboxes. Authenticate with `Authorization: Bearer <token>`.",
    )
    app.state.metrics = ApiMetrics()
    app.add_middleware(BodyLimitMiddleware, router=app.router)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # outermost: it counts the 413s too
    install_error_handlers(app)
    app.include_router(health.router)
    for module in (environments, tasks, runs, episodes, groups, sandboxes, policy, metric_names, meta):
        app.include_router(module.router)
    install_dashboard(app)
    return app


app = create_app()
