"""`/login` (a 401 page holding the token form: nothing but /healthz answers without a token),
`POST /login` (checks the token, sets the cookie) and `/logout`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from api.dashboard.rendering import COOKIE_MAX_AGE, render
from api.deps import COOKIE_NAME, PageToken, SessionDep
from api.services.tokens import Unauthorized, authenticate

router = APIRouter(include_in_schema=False)


def safe_next(next_url: str | None) -> str:
    """Only a path on this server (no scheme, no host, no `//`): the login form is no open redirect."""
    if not next_url or not next_url.startswith("/") or next_url.startswith("//") or "\\" in next_url:
        return "/"
    return next_url


def set_token_cookie(response: Response, *, token: str, secure: bool) -> None:
    response.set_cookie(COOKIE_NAME, token, max_age=COOKIE_MAX_AGE, httponly=True, samesite="strict", secure=secure,
                        path="/")


@router.get("/login")
def login_form(request: Request, next: str = "/") -> Response:
    """The form, with 401: a page without a token is unauthorised, the form says how to get one."""
    return render(request, "login.html", {"next_url": safe_next(next), "reason": None}, status_code=401)


@router.post("/login")
def login(
    request: Request, session: SessionDep, token: Annotated[str, Form(max_length=256)] = "",
    next: Annotated[str, Form(max_length=2048)] = "/",
) -> Response:
    try:
        authenticate(session, token=token.strip())
    except Unauthorized as error:
        return render(request, "login.html", {"next_url": safe_next(next), "reason": str(error)}, status_code=401)
    response = RedirectResponse(safe_next(next), status_code=303)
    set_token_cookie(response, token=token.strip(), secure=request.url.scheme == "https")
    return response


@router.get("/logout")
def logout(_: PageToken) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/")
    return response
