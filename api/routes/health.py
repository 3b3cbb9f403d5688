"""`/healthz`: the one route that needs no token. 200 when the database answers, else 503."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from core.db import check_database, get_engine
from core.errors import CrucibleError

router = APIRouter()


@router.get("/healthz", tags=["health"])
def healthz() -> JSONResponse:
    try:
        version = check_database(get_engine())
    except CrucibleError as error:
        return JSONResponse({"status": "unavailable", "database": str(error)}, status_code=503)
    return JSONResponse({"status": "ok", "database": f"PostgreSQL {version}"})
