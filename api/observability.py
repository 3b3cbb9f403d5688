"""Prometheus metrics of the API process: request counts and latencies per route, and the store's state.

Each app has its own registry (no global state), so several apps in one process do not collide.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.services.prometheus import StoreCollector
from core.db import session_scope


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("crucible_api_requests", "HTTP requests served.", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("crucible_api_request_seconds", "HTTP request latency.", ["method", "route"],
                                 registry=self.registry)
        self.registry.register(StoreCollector(session_scope))


class MetricsMiddleware:
    """Pure ASGI middleware: counts every HTTP request by its route template (bounded label values)."""

    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_and_record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(scope["method"], template, str(status["code"])).inc()
            self.metrics.latency.labels(scope["method"], template).observe(time.perf_counter() - started)
