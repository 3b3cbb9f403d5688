"""Sandboxes: their events (`/v1/sandboxes/{sandbox_id}/events`, `/v1/episodes/{episode_id}/sandbox-events`), and
the sandboxes of every worker host, reached through the worker that holds them (api/services/sandbox_control.py):
`GET /v1/sandboxes`, `POST /v1/sandboxes/{sandbox_id}/exec`, `GET`/`PUT /v1/sandboxes/{sandbox_id}/archive`."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from api.deps import SessionDep, current_token
from api.errors import ApiError
from api.limits import streamed_upload
from api.pagination import DEFAULT_LIMIT, Cursor, Limit
from api.params import EpisodeId, OptionalId, SandboxId
from api.schemas.common import ERROR_RESPONSES
from api.schemas.sandboxes import ArchiveWritten, FleetSandboxesPublic, SandboxEventsPublic, SandboxExecPublic
from api.services import sandbox_control, sandboxes
from core.schemas.sandbox_control import SandboxExec

router = APIRouter(tags=["sandboxes"], dependencies=[Depends(current_token)], responses=ERROR_RESPONSES)

Kind = Annotated[str | None, Query(min_length=1, max_length=32, pattern=r"^[a-z_]+$",
                                   description="Only this event kind (create, acquire, exec, reset, destroy…).")]


@router.get("/v1/sandboxes/{sandbox_id}/events", response_model=SandboxEventsPublic)
def list_sandbox_events(
    sandbox_id: SandboxId, session: SessionDep, kind: Kind = None, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT
) -> SandboxEventsPublic:
    """Every lifecycle event of one sandbox, oldest first."""
    data, next_cursor = sandboxes.sandbox_events(session, sandbox_id=sandbox_id, kind=kind, cursor=cursor, limit=limit)
    return SandboxEventsPublic(data=data, next_cursor=next_cursor)


@router.get("/v1/episodes/{episode_id}/sandbox-events", response_model=SandboxEventsPublic)
def list_episode_sandbox_events(
    episode_id: EpisodeId, session: SessionDep, kind: Kind = None, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT
) -> SandboxEventsPublic:
    """What the episode's sandbox went through while it ran, oldest first."""
    data, next_cursor = sandboxes.episode_events(session, episode_id=episode_id, kind=kind, cursor=cursor, limit=limit)
    return SandboxEventsPublic(data=data, next_cursor=next_cursor)


SandboxPath = Annotated[str, Query(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$",
                                   description="An absolute path inside the sandbox.")]
Answer = TypeVar("Answer", bound=BaseModel)
WORKER_ERRORS: dict[int | str, dict[str, Any]] = {
    502: {"description": "The worker holding the sandbox did not answer, or failed."}}


def _bearer(request: Request) -> str:
    """The caller's own `Authorization` header, forwarded to the worker, which checks the token again (a
    dashboard cookie is not forwarded: these routes take a bearer token)."""
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("bearer "):
        raise ApiError(401, "unauthorized", "expected `Authorization: Bearer <token>` (these routes reach a worker "
                                            "with the caller's own token), got none", headers={"WWW-Authenticate": "Bearer"})
    return header


@router.get("/v1/sandboxes", response_model=FleetSandboxesPublic, responses=WORKER_ERRORS)
def list_fleet_sandboxes(request: Request, session: SessionDep, run_id: OptionalId = None) -> FleetSandboxesPublic:
    """The sandboxes leased to a run (to `run_id`, if given) on every live worker host, as each worker lists
    them; workers that did not answer are named in `unreachable`."""
    listed = sandbox_control.list_fleet(session, authorization=_bearer(request), run_id=run_id)
    return FleetSandboxesPublic.model_validate(listed)


@router.post("/v1/sandboxes/{sandbox_id}/exec", response_model=SandboxExecPublic, responses=WORKER_ERRORS)
def exec_in_sandbox(sandbox_id: SandboxId, body: SandboxExec, request: Request, session: SessionDep) -> SandboxExecPublic:
    """Run a command in a sandbox leased to a run, on whichever host holds it (through its worker)."""
    response = sandbox_control.forward(session, sandbox_id=sandbox_id, authorization=_bearer(request), method="POST",
                                       path=f"/v1/sandboxes/{sandbox_id}/exec", json=body.model_dump(),
                                       timeout_s=sandbox_control.TIMEOUT_S + (body.timeout_s or 600))
    return _answer(SandboxExecPublic, response, sandbox_id)


@router.get("/v1/sandboxes/{sandbox_id}/archive", response_class=Response, responses={
    **WORKER_ERRORS, 200: {"content": {"application/x-tar": {}}, "description": "A tar of the path."}})
def get_sandbox_archive(sandbox_id: SandboxId, path: SandboxPath, request: Request, session: SessionDep) -> Response:
    """A tar of `path` in a sandbox leased to a run, on whichever host holds it."""
    response = sandbox_control.forward(session, sandbox_id=sandbox_id, authorization=_bearer(request), method="GET",
                                       path=f"/v1/sandboxes/{sandbox_id}/archive", params={"path": path})
    return Response(content=response.content, media_type="application/x-tar")


@router.put("/v1/sandboxes/{sandbox_id}/archive", response_model=ArchiveWritten, responses=WORKER_ERRORS,
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
@streamed_upload
async def put_sandbox_archive(sandbox_id: SandboxId, path: SandboxPath, request: Request,
                              session: SessionDep) -> ArchiveWritten:
    """Unpack the body (a tar) at `path` in a sandbox leased to a run, on whichever host holds it."""
    data = await request.body()  # counted as it streams, up to CRUCIBLE_API_MAX_UPLOAD_BYTES (@streamed_upload)
    response = await run_in_threadpool(
        sandbox_control.forward, session, sandbox_id=sandbox_id, authorization=_bearer(request), method="PUT",
        path=f"/v1/sandboxes/{sandbox_id}/archive", params={"path": path}, content=data)
    return _answer(ArchiveWritten, response, sandbox_id)


def _answer(model: type[Answer], response: Any, sandbox_id: str) -> Answer:
    """The worker's answer as `model`; 502 when it answered something else."""
    try:
        return model.model_validate(response.json())
    except ValueError:  # not JSON, or not that shape (pydantic's ValidationError is a ValueError)
        raise ApiError(502, "worker_error", f"sandbox {sandbox_id}: its worker answered something other than "
                                            f"a {model.__name__}") from None
