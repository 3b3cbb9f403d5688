"""`/v1/openapi.json` (behind the token like everything else) and Prometheus `/metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import current_token

router = APIRouter(dependencies=[Depends(current_token)], include_in_schema=False)


@router.get("/v1/openapi.json")
def openapi_schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/metrics")
def prometheus_metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
