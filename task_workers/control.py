"""A worker's sandbox control service: its sandboxes listed, a command run in one, files copied in and out,
for `crucible sandbox ls / exec / cp --api` from another host, through the API.

    GET  /v1/sandboxes?run_id=R                      this worker's sandboxes leased to a run
    POST /v1/sandboxes/{sandbox_id}/exec             {"command": "pytest -q", "timeout_s": 60}
    GET  /v1/sandboxes/{sandbox_id}/archive?path=/workspace/x    a tar of it
    PUT  /v1/sandboxes/{sandbox_id}/archive?path=/workspace      a tar unpacked there

The API forwards its caller's request here (api/services/sandbox_control.py), and this service checks
the caller's token itself, as the API does (core/tokens.py): nobody reaches a sandbox through it without
a live API token, whoever can reach its address. The engine's socket never leaves the worker's host.
Only sandboxes of this worker (label `crucible.worker`) whose lease names a run are served — an idle
pool sandbox, a CLI's detached one or another process's are not — each by its exact sandbox id.

The worker starts it beside its heartbeat, on CRUCIBLE_WORKER_CONTROL_ADDRESS (host:port, port 0 for any
free one; `off` for none), and publishes its URL in its `workers` row.
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.db import session_scope
from core.schemas.sandbox_control import SandboxExec
from core.tokens import Unauthorized, authenticate
from sandboxes import admin
from sandboxes import labels as L
from sandboxes.backend import ContainerInfo, SandboxBackend
from sandboxes.create import is_sandbox_id
from sandboxes.errors import SandboxError

logger = logging.getLogger(__name__)

MAX_ARCHIVE_BYTES = 64 << 20
"""Most bytes copied in or out in one request."""
MAX_BODY_BYTES = 256 << 10
"""Most bytes of any other request's body (an exec's JSON)."""
MAX_CONCURRENT = 32
"""Requests served at once; more are answered 503 (uvicorn's limit_concurrency)."""
AbsolutePath = Annotated[str, Query(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$",
                                    description="An absolute path inside the sandbox.")]


def create_control_app(backend: SandboxBackend, *, worker: str) -> FastAPI:
    """The control service of the worker named `worker`, over its engine `backend`."""
    app = FastAPI(title=f"Crucible worker {worker}: sandbox control", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_TokenFirst)

    def mine() -> list[ContainerInfo]:
        return [info for info in backend.list(labels={L.WORKER: worker}) if info.running]

    def leased(sandbox_id: str) -> ContainerInfo:
        """The sandbox, if its lease (root's file, renewed by its holder) names a run now: not an idle one, not
        one being reset for the next episode (its pool marks it `recycling` first), not an expired lease."""
        infos = [info for info in mine() if info.sandbox_id == sandbox_id]
        leases = admin.read_leases(backend, infos)
        for info in infos:
            lease = leases.get(info.id)
            if lease is not None and lease.held_by_run:
                return info
        raise HTTPException(404, f"sandbox {sandbox_id}: expected a sandbox of worker {worker} leased to a run, got "
                                 f"{'one leased to none' if infos else 'none'}")

    @app.get("/v1/sandboxes")
    def list_sandboxes(run_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None) -> list[dict[str, Any]]:
        infos = mine()
        leases = admin.read_leases(backend, infos)
        rows = [admin.row(info, lease) for info in infos if (lease := leases.get(info.id)) and lease.held_by_run]
        return [row.as_dict() for row in rows if run_id is None or row.run == str(run_id)]

    @app.post("/v1/sandboxes/{sandbox_id}/exec")
    def exec_(sandbox_id: str, body: SandboxExec) -> dict[str, Any]:
        sandbox = admin.attach(backend, leased(_checked(sandbox_id)))
        try:
            result = sandbox.step(body.command, timeout_s=body.timeout_s)
        finally:
            sandbox.close_session()
        return {"sandbox_id": sandbox_id, "worker": worker, "stdout": result.stdout, "exit_code": result.exit_code,
                "status": result.status.value, "duration_s": result.duration_s,
                "truncated_bytes": result.truncated_bytes}

    @app.get("/v1/sandboxes/{sandbox_id}/archive")
    def get_archive(sandbox_id: str, path: AbsolutePath) -> Response:
        sandbox = admin.attach(backend, leased(_checked(sandbox_id)))
        try:
            data = sandbox.get_archive(path)
        except SandboxError as error:
            raise HTTPException(404, str(error)[:500]) from None
        if len(data) > MAX_ARCHIVE_BYTES:
            raise HTTPException(413, f"{path}: expected at most {MAX_ARCHIVE_BYTES} bytes of tar, got {len(data)}")
        return Response(content=data, media_type="application/x-tar")

    @app.put("/v1/sandboxes/{sandbox_id}/archive")
    async def put_archive(sandbox_id: str, path: AbsolutePath, request: Request) -> dict[str, Any]:
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_ARCHIVE_BYTES:
                raise HTTPException(413, f"body: expected at most {MAX_ARCHIVE_BYTES} bytes of tar, got more")
        def put() -> None:
            sandbox = admin.attach(backend, leased(_checked(sandbox_id)))
            try:
                sandbox.put_archive(bytes(data), dest=path)
            except SandboxError as error:
                raise HTTPException(400, str(error)[:500]) from None

        await run_in_threadpool(put)  # docker calls: never on the event loop
        return {"sandbox_id": sandbox_id, "path": path, "bytes": len(data)}

    return app


class _TokenFirst:
    """Pure ASGI, around every route: the caller's token is checked before any byte of its body is read, and
    a body past its limit (MAX_BODY_BYTES; an archive's MAX_ARCHIVE_BYTES) is refused as it streams, so that
    nobody without a live API token can make this worker hold anything."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        try:
            await run_in_threadpool(_authenticate, credentials if scheme.lower() == "bearer" else None)
        except Unauthorized as error:
            await JSONResponse({"detail": str(error)}, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        limit = MAX_ARCHIVE_BYTES if scope["path"].endswith("/archive") else MAX_BODY_BYTES
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await JSONResponse({"detail": f"body: expected at most {limit} bytes, got {declared}"}, 413)(
                scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise HTTPException(413, f"body: expected at most {limit} bytes, got more")
            return message

        await self.app(scope, counted, send)


def _authenticate(token: str | None) -> None:
    with session_scope() as session:
        authenticate(session, token=token)


def _checked(sandbox_id: str) -> str:
    if not is_sandbox_id(sandbox_id):
        raise HTTPException(422, f"sandbox_id: expected sb- and 10 hex digits, got {sandbox_id[:40]!r}")
    return sandbox_id


class ControlServer:
    """The control service on a thread of its own (uvicorn; the worker keeps its own signal handlers)."""

    def __init__(self, app: FastAPI, *, host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
                                limit_concurrency=MAX_CONCURRENT)
        self._server = uvicorn.Server(config)  # off the main thread, uvicorn installs no signal handler
        self._thread = threading.Thread(target=self._server.run, name="crucible-sandbox-control", daemon=True)
        self._host = host

    def start(self, timeout_s: float = 30.0) -> str:
        """Start serving; the URL it answers at."""
        self._thread.start()
        pause = threading.Event()
        for _ in range(int(timeout_s / 0.05)):
            if self._server.started or not self._thread.is_alive():
                break
            pause.wait(0.05)
        if not self._server.started:
            raise RuntimeError(f"the sandbox control service did not start on {self._host} within {timeout_s:g} s")
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
