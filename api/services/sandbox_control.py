"""Sandboxes on any worker host, reached through the worker that holds them (task_workers/control.py):
listed, a command run in one, files copied in and out. The API never opens an engine's socket: it finds
the sandbox's worker (the worker its events name, alive, with a control URL), and forwards the caller's
request with the caller's own token, which that worker checks again."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import ApiError
from core.models import SandboxEvent, Worker
from core.models.worker import alive

TIMEOUT_S = 30.0
"""A worker's answer, past a command's own timeout."""
MAX_RESPONSE_BYTES = (64 << 20) + (1 << 20)
"""Most bytes of a worker's answer (its largest, an archive, is 64 MiB): past it, the answer is refused."""


def list_fleet(session: Session, *, authorization: str, run_id: int | None) -> dict[str, Any]:
    """Every live worker's sandboxes leased to a run (to `run_id`, if given), and the workers that did not
    answer."""
    workers = session.execute(select(Worker.name, Worker.control_url).where(
        alive(), Worker.control_url.is_not(None)).order_by(Worker.name)).all()
    session.commit()  # no transaction held across the calls (the worker checks the same token's row)

    def ask(name: str, url: str) -> tuple[str, list[dict[str, Any]] | str]:
        try:
            with _client(url, authorization) as client:
                response = client.get("/v1/sandboxes", params={} if run_id is None else {"run_id": run_id})
        except httpx.HTTPError as error:
            return name, f"{type(error).__name__}: {str(error)[:200]}"
        if response.status_code != 200:
            return name, f"HTTP {response.status_code}: {response.text[:200]}"
        try:
            rows = response.json()
            if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
                raise TypeError(f"expected a list of sandboxes, got {type(rows).__name__}")
        except (ValueError, TypeError) as error:  # a worker that answers nonsense is one that did not answer
            return name, f"{type(error).__name__}: {str(error)[:200]}"
        return name, rows

    rows: list[dict[str, Any]] = []
    unreachable: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(workers)))) as pool:
        for name, answer in pool.map(lambda worker: ask(*worker), workers):
            if isinstance(answer, str):
                unreachable[name] = answer
            else:
                rows.extend({**row, "worker": name} for row in answer)
    return {"data": rows, "unreachable": unreachable}


def forward(session: Session, *, sandbox_id: str, authorization: str, method: str, path: str,
            params: dict[str, str] | None = None, json: Any = None, content: bytes | None = None,
            timeout_s: float = TIMEOUT_S) -> httpx.Response:
    """The request sent on to the worker that holds `sandbox_id`; its answer (2xx), or ApiError with the
    worker's reason."""
    url = _worker_url(session, sandbox_id)
    session.commit()  # no transaction held across the call (the worker checks the same token's row)
    try:
        with _client(url, authorization, timeout_s=timeout_s) as client, client.stream(
                method, path, params=params, json=json, content=content) as streamed:
            body = bytearray()
            for chunk in streamed.iter_bytes():
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise ApiError(502, "worker_error", f"sandbox {sandbox_id}: its worker answered more than "
                                                        f"{MAX_RESPONSE_BYTES} bytes")
            response = httpx.Response(streamed.status_code, headers=streamed.headers, content=bytes(body))
    except httpx.HTTPError as error:
        raise ApiError(502, "worker_unreachable", f"sandbox {sandbox_id}: its worker at {url} did not answer "
                                                  f"({type(error).__name__})") from None
    if response.status_code >= 400:
        try:
            reason = str(response.json().get("detail"))
        except (ValueError, AttributeError):
            reason = response.text
        code = {401: "unauthorized", 404: "not_found", 413: "too_large", 422: "invalid"}.get(response.status_code,
                                                                                            "worker_error")
        raise ApiError(response.status_code if response.status_code in (401, 404, 413, 422) else 502, code,
                       reason[:1000])
    return response


def _worker_url(session: Session, sandbox_id: str) -> str:
    """The control URL of the live worker whose events name `sandbox_id`."""
    worker = session.execute(select(SandboxEvent.worker).where(SandboxEvent.sandbox_id == sandbox_id,
                                                               SandboxEvent.worker.is_not(None))
                             .order_by(SandboxEvent.id.desc()).limit(1)).scalar_one_or_none()
    if worker is None:
        raise ApiError(404, "not_found", f"sandbox {sandbox_id}: expected a sandbox a worker made, got none by that id")
    row = session.execute(select(Worker.control_url, alive().label("alive")).where(Worker.name == worker)).one_or_none()
    if row is None or not row.alive or row.control_url is None:
        why = "unknown" if row is None else "not alive" if not row.alive else "without a control service"
        raise ApiError(404, "not_found", f"sandbox {sandbox_id}: expected a live worker with a control service "
                                         f"holding it, got its worker {worker!r} {why}")
    return str(row.control_url)


@contextmanager
def _client(url: str, authorization: str, *, timeout_s: float = TIMEOUT_S) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, headers={"Authorization": authorization}, timeout=timeout_s,
                      follow_redirects=False, trust_env=False) as client:
        yield client
