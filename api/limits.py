"""Limits on every request body, enforced as the bytes arrive and before any route does work.

    app.add_middleware(BodyLimitMiddleware, router=app.router)

    any body           a declared Content-Length over the limit: 413 at once, nothing read
    parsed bodies      JSON and forms: read up to CRUCIBLE_API_MAX_BODY_BYTES (413 past it), and JSON
                       is checked before the route parses it again: nesting at most MAX_DEPTH deep,
                       no lone UTF-16 surrogates (422 limit_exceeded)
    streamed uploads   routes marked `@streamed_upload`: counted as they stream, up to
                       CRUCIBLE_API_MAX_UPLOAD_BYTES; past it the route's next read raises BodyTooLarge

The header limit is the server's (`api.server`: h11 refuses a request head over
CRUCIBLE_API_MAX_HEADER_BYTES with 431 before any of this runs).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError, error_body
from core.config_files import MAX_DEPTH, DataLimitError, check_data
from core.settings import get_settings

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
STREAMED_ATTRIBUTE = "__crucible_streamed_upload__"


class BodyTooLarge(ApiError):
    """The body grew past its limit while a route was reading it."""

    def __init__(self, *, limit: int) -> None:
        super().__init__(413, "too_large", f"body: expected at most {limit} bytes, got more",
                         headers={"Connection": "close"})


def streamed_upload(endpoint: Endpoint) -> Endpoint:
    """Mark a route that streams its body itself (to disk): it gets the upload limit, counted live."""
    setattr(endpoint, STREAMED_ATTRIBUTE, True)
    return endpoint


class BodyLimitMiddleware:
    """Pure ASGI: a body past its limit never reaches memory, a malformed JSON shape never a route."""

    def __init__(self, app: ASGIApp, *, router: Router) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = get_settings()
        streamed = self._is_streamed(scope)
        limit = settings.api_max_upload_bytes if streamed else settings.api_max_body_bytes
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            expected = f"at most {limit} bytes" if declared.isdigit() else "a Content-Length of digits"
            await _answer(send, 413 if declared.isdigit() else 400, "too_large" if declared.isdigit() else "bad_request",
                          f"body: expected {expected}, got a Content-Length of {declared[:40]!r}")
            return
        if streamed:
            await self.app(scope, _counting(receive, limit=limit), send)
            return
        body = await _read_body(receive, limit=limit)
        if body is None:
            await _answer(send, 413, "too_large", f"body: expected at most {limit} bytes, got more")
            return
        if body and _parsed_as_json(headers.get("content-type", "")):
            problem = _json_problem(body)
            if problem is not None:
                await _answer(send, 422, "limit_exceeded", problem, close=False)
                return
        await self.app(scope, _replaying(body, receive), send)

    def _is_streamed(self, scope: Scope) -> bool:
        for route in self.router.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return bool(getattr(getattr(route, "endpoint", None), STREAMED_ATTRIBUTE, False))
        return False


def _parsed_as_json(content_type: str) -> bool:
    """What FastAPI parses as JSON: no content type at all, application/json, or any `+json` type."""
    media = content_type.split(";")[0].strip().lower()
    return media in ("", "application/json") or media.endswith("+json")


def _json_problem(body: bytes) -> str | None:
    """Why a JSON body must be refused before a route parses it, or None (a syntax error is the route's)."""
    try:
        data = json.loads(body)
    except RecursionError:
        return f"body: expected JSON nested at most {MAX_DEPTH} deep, got far deeper"
    except ValueError:
        return None  # not JSON at all: the route says so in its own words
    try:
        check_data(data, source="body")
    except DataLimitError as error:
        return str(error)
    return None


async def _read_body(receive: Receive, *, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes `limit` (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: hand the app what there is, it will see the disconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _counting(receive: Receive, *, limit: int) -> Receive:
    size = 0

    async def counted() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise BodyTooLarge(limit=limit)
        return message

    return counted


async def _answer(send: Send, status: int, code: str, message: str, *, close: bool = True) -> None:
    """The one error shape, sent by the middleware itself; `close` drops a body the client still sends."""
    payload = json.dumps(error_body(code, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
