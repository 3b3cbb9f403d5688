"""The dashboard: server-rendered pages (Jinja2), a little vanilla JS and inline SVG charts.

No build step and nothing fetched from outside the server (the Content-Security-Policy says so).
Every page is deep-linkable and needs a token: from the login form's cookie or the header, never
from the URL (see api.deps). The login form is a POST guarded against login CSRF (api.dashboard.login).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from api.dashboard import login, pages
from api.dashboard.rendering import COOKIE_MAX_AGE
from api.deps import COOKIE_NAME, LoginRequired


async def _login_required(request: Request, error: Exception) -> Response:
    assert isinstance(error, LoginRequired)
    return login.login_page(request, next_url=error.next_url, reason=error.reason)


async def _page_redirect(request: Request, error: Exception) -> Response:
    assert isinstance(error, pages.PageRedirect)
    return RedirectResponse(error.url, status_code=303)


def install_dashboard(app: FastAPI) -> None:
    app.include_router(login.router)
    app.include_router(pages.router)
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(pages.PageRedirect, _page_redirect)


__all__ = ["COOKIE_MAX_AGE", "COOKIE_NAME", "install_dashboard"]
