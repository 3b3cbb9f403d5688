"""The error envelope every 4xx/5xx uses, and the error responses each router documents."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    code: str
    """Stable machine-readable code: not_found, validation_error, unauthorized, conflict…"""
    message: str
    """One sentence: what was expected and what was given."""
    detail: Any = None
    """Structured extras, e.g. the list of invalid fields."""


class ErrorResponse(BaseModel):
    error: ErrorDetail


def _described(text: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": text}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _described("The body cannot be parsed (not UTF-8 JSON, a broken multipart form)."),
    401: _described("No token, or an unknown or revoked one."),
    404: _described("The id names nothing."),
    413: _described("The body is larger than CRUCIBLE_API_MAX_BODY_BYTES (uploads: CRUCIBLE_API_MAX_UPLOAD_BYTES)."),
    422: _described("A parameter or body field is invalid, or the body breaks a limit (nesting, encoding, size)."),
    503: _described("The database does not answer, or the server is at CRUCIBLE_API_MAX_CONNECTIONS."),
}
MUTATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES, 409: _described("The resource's state does not allow it."),
}
