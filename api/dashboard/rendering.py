"""Jinja2 rendering for the dashboard: one autoescaping environment, formatting filters, and the
security headers every page carries (the CSP forbids anything not served by this server)."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
COOKIE_MAX_AGE = 30 * 24 * 3600
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")


def _number(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


def _when(value: datetime | None) -> str:
    return "–" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _query(base: dict[str, Any], **changes: Any) -> str:
    merged = {**base, **changes}
    return urlencode({key: value for key, value in merged.items() if value not in (None, "")})


environment = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True, undefined=StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True)
environment.filters.update(number=_number, when=_when, seconds=_seconds, pretty=_pretty, compact=_compact)
environment.globals.update(query=_query)


def render(request: Request, template: str, context: dict[str, Any], *, status_code: int = 200) -> HTMLResponse:
    html = environment.get_template(template).render(request=request, path=request.url.path, **context)
    response = HTMLResponse(html, status_code=status_code)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response
