"""The FastAPI application: `/v1` REST, the dashboard and `/healthz`.

    crucible api --host 127.0.0.1 --port 8080
"""

from __future__ import annotations

from fastapi import FastAPI

from api.routes import health


def create_app() -> FastAPI:
    app = FastAPI(title="Crucible", version="0.1.0", openapi_url="/v1/openapi.json", docs_url="/v1/docs")
    app.include_router(health.router)
    return app


app = create_app()
