"""One error format for every 4xx and 5xx: `{"error": {"code", "message", "detail"}}`.

    ApiError                  raised by routes and deps with an explicit status and code
    CrucibleError → status    NotFound 404, ConfigError 422, InvalidRunState 409, NoEligibleTask 409, ArchiveError 409,
                              ServiceUnavailable 503, any other CrucibleError 400
    RequestValidationError    422 validation_error, one line per bad field in `message`
    HTTPException             its status, a code named after it (not_found, method_not_allowed…)
    DataError (database)      422 invalid_value: Postgres refused a value (a NUL byte, an overflow)
    OperationalError          422 too_large when Postgres refused a value for its size (SQLSTATE class
                              54: an index row, a tsvector, a JSONB too big); 503 service_unavailable
                              when the database cannot be reached; 503 database_error otherwise, saying
                              what Postgres said
    anything else             500 internal_error (logged with its traceback)
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller.errors import InvalidRunState, NoEligibleTask
from core.archive import ArchiveError
from core.config_files import DataLimitError
from core.errors import ConfigError, CrucibleError, NotFound, ServiceUnavailable
from core.pools import PoolHeld
from core.settings import get_settings

logger = logging.getLogger("crucible.api")

_CRUCIBLE_STATUS: list[tuple[type[CrucibleError], int, str]] = [
    (NotFound, 404, "not_found"),
    (DataLimitError, 422, "limit_exceeded"),
    (ConfigError, 422, "invalid"),
    (InvalidRunState, 409, "conflict"),
    (PoolHeld, 409, "conflict"),
    (NoEligibleTask, 409, "no_eligible_task"),
    (ArchiveError, 409, "archived"),
    (ServiceUnavailable, 503, "service_unavailable"),
]


class ApiError(Exception):
    """An error with its HTTP status, a stable machine code and a sentence for people."""

    def __init__(self, status: int, code: str, message: str, *, detail: Any = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        self.headers = headers


def error_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "detail": detail}}


def error_response(status: int, code: str, message: str, *, detail: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message, detail), status_code=status, headers=headers)


def _status_code_name(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _validation_detail(error: RequestValidationError) -> list[dict[str, Any]]:
    """JSON-safe copies of pydantic's errors: location, message, type and the given value (shortened)."""
    items = []
    for item in error.errors():
        entry = {"loc": [str(part) for part in item.get("loc", ())], "msg": str(item.get("msg", "")),
                 "type": str(item.get("type", ""))}
        if "input" in item:
            entry["input"] = _short(item["input"])
        items.append(entry)
    return items


def _validation_message(detail: list[dict[str, Any]]) -> str:
    lines = []
    for item in detail[:5]:
        where = ".".join(part for part in item["loc"] if part not in ("body",)) or "request"
        given = f", got {item['input']}" if "input" in item and " got " not in item["msg"] else ""
        lines.append(f"{where}: {item['msg'].removeprefix('Value error, ')}{given}")
    more = f" (and {len(detail) - 5} more)" if len(detail) > 5 else ""
    return "; ".join(lines) + more


def crucible_status(error: CrucibleError) -> tuple[int, str]:
    for kind, status, code in _CRUCIBLE_STATUS:
        if isinstance(error, kind):
            return status, code
    return 400, "bad_request"


async def _api_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return error_response(error.status, error.code, error.message, detail=error.detail, headers=error.headers)


async def _crucible_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, CrucibleError)
    status, code = crucible_status(error)
    return error_response(status, code, str(error))


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    message = error.detail if isinstance(error.detail, str) else _status_code_name(error.status_code)
    if error.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}; GET /v1/openapi.json lists the routes"
    if error.status_code == 400 and message == "There was an error parsing the body":
        message = f"body: expected {request.headers.get('content-type') or 'a body'} that parses, got one that does not"
    headers = dict(error.headers) if error.headers else {}
    if error.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return error_response(error.status_code, _status_code_name(error.status_code), message, headers=headers or None)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (Starlette's own Allow names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        regex = getattr(route, "path_regex", None)
        if regex is not None and regex.match(request.url.path):
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    detail = _validation_detail(error)
    return error_response(422, "validation_error", _validation_message(detail), detail=detail)


async def _data_error(request: Request, error: Exception) -> JSONResponse:
    reason = str(getattr(error, "orig", error)).strip().splitlines()[0]
    return error_response(422, "invalid_value", f"the database refused a value: {reason}")


def _database_reason(error: Exception) -> tuple[str | None, str]:
    """(SQLSTATE or None, Postgres' first line) of a SQLAlchemy error wrapping a psycopg one."""
    original = getattr(error, "orig", None)
    state = getattr(original, "sqlstate", None)
    lines = str(original or error).strip().splitlines()
    return (state if isinstance(state, str) else None), (lines[0] if lines else type(error).__name__)


async def _operational_error(request: Request, error: Exception) -> JSONResponse:
    state, reason = _database_reason(error)
    if state is not None and state.startswith("54"):  # program_limit_exceeded and friends: the value, not the server
        return error_response(422, "too_large", f"the database refused a value as too large: {reason}")
    if state is None or state.startswith(("08", "57P")):  # no connection, or the server is shutting down
        logger.warning("database unavailable: %s", error)
        return error_response(503, "service_unavailable", "the database does not answer; try again shortly")
    logger.warning("database error %s on %s %s: %s", state, request.method, request.url.path, reason)
    return error_response(503, "database_error", f"the database failed the request ({state}): {reason}")


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    if get_settings().environment == "production":  # no internals in production answers
        return error_response(500, "internal_error", "unexpected error; the server log has the details")
    return error_response(500, "internal_error", f"unexpected {type(error).__name__}; the server log has the traceback")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(CrucibleError, _crucible_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(DataError, _data_error)
    app.add_exception_handler(OperationalError, _operational_error)
    app.add_exception_handler(Exception, _unexpected)
