"""Injected dependencies: a database session per request and the caller's API token.

    SessionDep    a Session that commits when the request succeeds and rolls back if it raises
    CurrentToken  the live ApiToken the request presented (401 otherwise)
    PageToken     the same for dashboard pages: a 401 login form instead of JSON

A token comes from `Authorization: Bearer <token>`, or, for GET and HEAD only, from the dashboard's
cookie (mutating requests need the header, so a cookie alone cannot be used for cross-site writes). The
cookie holds a dashboard session's own secret, never the token: /logout revokes the session, so a
copied cookie stops working, and the token itself is never in a browser's cookie store.
Never from the URL: a token in a query string lands in access logs, browser history and Referer
headers, and `/?token=X` would log a victim into X's account (login CSRF).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated
from urllib.parse import urlencode

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from api.errors import ApiError
from api.services.tokens import Unauthorized, authenticate, session_token
from core.db import session_scope
from core.models import ApiToken

COOKIE_NAME = "crucible_token"
SAFE_METHODS = ("GET", "HEAD")

_bearer = HTTPBearer(auto_error=False, description="An API token from `crucible token create NAME`.")


def get_db() -> Iterator[Session]:
    with session_scope() as session:
        yield session


# scope="function": the session commits when the handler returns, before the response is sent. FastAPI's
# default ("request", since 0.118) commits after the client has its answer, so a browser following the
# 303 of a sign-in could be refused on its next request (tests/dashboard/test_commit_before_response.py).
SessionDep = Annotated[Session, Depends(get_db, scope="function")]


class LoginRequired(Exception):
    """A dashboard page was asked for without a live token: answer 401 with the login form."""

    def __init__(self, *, next_url: str, reason: str) -> None:
        super().__init__(reason)
        self.next_url = next_url
        self.reason = reason


def caller(request: Request, session: Session, credentials: HTTPAuthorizationCredentials | None) -> ApiToken:
    """The live token of the request: its bearer header, else (reads only) its dashboard session's."""
    header = request.headers.get("authorization")
    if header and credentials is None:
        scheme = header.split(" ", 1)[0]
        raise ApiError(401, "unauthorized", f"expected `Authorization: Bearer <token>`, got a {scheme[:20]!r} header",
                       headers={"WWW-Authenticate": "Bearer"})
    if credentials is not None:
        return authenticate(session, token=credentials.credentials)
    if request.method in SAFE_METHODS and request.cookies.get(COOKIE_NAME):
        return session_token(session, secret=request.cookies[COOKIE_NAME])
    return authenticate(session, token=None)  # Unauthorized: says how to get one


def current_token(
    request: Request, session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> ApiToken:
    try:
        return caller(request, session, credentials)
    except Unauthorized as error:
        raise ApiError(401, "unauthorized", str(error), headers={"WWW-Authenticate": "Bearer"}) from None


CurrentToken = Annotated[ApiToken, Depends(current_token)]


def _path_with_query(request: Request, *, without: str | None = None) -> str:
    query = urlencode([(key, value) for key, value in request.query_params.multi_items() if key != without])
    return request.url.path + (f"?{query}" if query else "")


def page_token(
    request: Request, session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> ApiToken:
    try:
        return caller(request, session, credentials)
    except (Unauthorized, ApiError) as error:
        raise LoginRequired(next_url=_path_with_query(request, without="token"), reason=str(error)) from None


PageToken = Annotated[ApiToken, Depends(page_token)]
