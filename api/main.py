"""The FastAPI application: `/v1` REST, the dashboard, Prometheus `/metrics` and `/healthz`.

    crucible api --host 127.0.0.1 --port 8080      # then open http://127.0.0.1:8080/

Every route but `/healthz` needs an API token (`crucible token create NAME`).
"""

from __future__ import annotations

from fastapi import FastAPI

from api.dashboard import install_dashboard
from api.errors import install_error_handlers
from api.observability import ApiMetrics, MetricsMiddleware
from api.routes import environments, episodes, groups, health, meta, runs, sandboxes, tasks


def create_app() -> FastAPI:
    app = FastAPI(
        title="Crucible", version="0.1.0", openapi_url=None, docs_url=None, redoc_url=None,
        description="RL for LLM agents in real sandboxes. Authenticate with `Authorization: Bearer <token>`.",
    )
    app.state.metrics = ApiMetrics()
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    install_error_handlers(app)
    app.include_router(health.router)
    for module in (environments, tasks, runs, episodes, groups, sandboxes, meta):
        app.include_router(module.router)
    install_dashboard(app)
    return app


app = create_app()
