"""The dashboard: server-rendered pages (Jinja2), a little vanilla JS and inline SVG charts.

No build step and nothing fetched from outside the server (the Content-Security-Policy says so).
Every page is deep-linkable and needs a token: from the login form's cookie, the header, or
`?token=` once (it is moved into the cookie and dropped from the URL).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from api.dashboard import login, pages
from api.dashboard.rendering import COOKIE_MAX_AGE, render
from api.deps import COOKIE_NAME, LoginRequired, TokenFromQuery


async def _login_required(request: Request, error: Exception) -> Response:
    assert isinstance(error, LoginRequired)
    return render(request, "login.html", {"next_url": error.next_url, "reason": error.reason}, status_code=401)


async def _token_from_query(request: Request, error: Exception) -> Response:
    assert isinstance(error, TokenFromQuery)
    response = RedirectResponse(error.url, status_code=303)
    login.set_token_cookie(response, token=error.token, secure=request.url.scheme == "https")
    return response


async def _page_redirect(request: Request, error: Exception) -> Response:
    assert isinstance(error, pages.PageRedirect)
    return RedirectResponse(error.url, status_code=303)


def install_dashboard(app: FastAPI) -> None:
    app.include_router(login.router)
    app.include_router(pages.router)
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(TokenFromQuery, _token_from_query)
    app.add_exception_handler(pages.PageRedirect, _page_redirect)


__all__ = ["COOKIE_MAX_AGE", "COOKIE_NAME", "install_dashboard"]
