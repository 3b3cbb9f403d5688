"""`/login` (a 401 page holding the token form: nothing but /healthz answers without a token),
`POST /login` (checks the token, opens a dashboard session and sets its cookie: the session's own
secret, never the token) and `/logout` (revokes the session).

Login CSRF: a cross-site page could POST its own token to /login and so sign a victim in as the
attacker. Every rendering of the form sets a random nonce in a SameSite=Strict cookie and in a hidden
field; POST /login accepts only when both are present and equal (double submit: another site can
neither read the field nor set the cookie). A token never travels in a URL.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from api.dashboard.rendering import COOKIE_MAX_AGE, render
from api.deps import COOKIE_NAME, PageToken, SessionDep
from api.services.tokens import Unauthorized, authenticate, close_session, open_session
from core.settings import get_settings

router = APIRouter(include_in_schema=False)
NONCE_COOKIE = "crucible_login"
NONCE_MAX_AGE = 3600


def safe_next(next_url: str | None) -> str:
    """Only a path on this server (no scheme, no host, no `//`): the login form is no open redirect."""
    if not next_url or not next_url.startswith("/") or next_url.startswith("//") or "\\" in next_url:
        return "/"
    return next_url


def _secure(request: Request) -> bool:
    """Production cookies are always Secure (TLS ends at a proxy there); elsewhere when served over https."""
    return get_settings().environment == "production" or request.url.scheme == "https"


def set_session_cookie(response: Response, *, secret: str, secure: bool) -> None:
    response.set_cookie(COOKIE_NAME, secret, max_age=COOKIE_MAX_AGE, httponly=True, samesite="strict", secure=secure,
                        path="/")


def login_page(request: Request, *, next_url: str, reason: str | None) -> Response:
    """The form with a fresh nonce in its hidden field and in the nonce cookie, answered 401."""
    nonce = secrets.token_urlsafe(24)
    response = render(request, "login.html", {"next_url": safe_next(next_url), "reason": reason, "nonce": nonce},
                      status_code=401)
    response.set_cookie(NONCE_COOKIE, nonce, max_age=NONCE_MAX_AGE, httponly=True, samesite="strict",
                        secure=_secure(request), path="/login")
    return response


@router.get("/login")
def login_form(request: Request, next: str = "/") -> Response:
    """The form, with 401: a page without a token is unauthorised, the form says how to get one."""
    return login_page(request, next_url=next, reason=None)


@router.post("/login")
def login(
    request: Request, session: SessionDep, token: Annotated[str, Form(max_length=256)] = "",
    next: Annotated[str, Form(max_length=2048)] = "/", nonce: Annotated[str, Form(max_length=64)] = "",
) -> Response:
    expected = request.cookies.get(NONCE_COOKIE, "")
    if not expected or not nonce or not secrets.compare_digest(nonce.encode(errors="replace"), expected.encode()):
        return login_page(request, next_url=next, reason="expected the sign-in form of this server, got a form "
                          "without its nonce (sign in from this page)")
    try:
        row = authenticate(session, token=token.strip())
    except Unauthorized as error:
        return login_page(request, next_url=next, reason=str(error))
    response = RedirectResponse(safe_next(next), status_code=303)
    set_session_cookie(response, secret=open_session(session, token=row, max_age_s=COOKIE_MAX_AGE),
                       secure=_secure(request))
    response.delete_cookie(NONCE_COOKIE, path="/login")  # one nonce, one sign-in
    return response


@router.get("/logout")
def logout(request: Request, session: SessionDep, _: PageToken) -> Response:
    """Sign out: the session is revoked server-side (a copy of the cookie signs no one in), the cookie cleared."""
    close_session(session, secret=request.cookies.get(COOKIE_NAME))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/")
    return response
