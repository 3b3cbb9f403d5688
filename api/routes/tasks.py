"""`/v1/tasks` and `/v1/environments/{name}/tasks`: upload JSONL, list with filters, show one."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from api.deps import SessionDep, current_token
from api.errors import ApiError
from api.pagination import DEFAULT_LIMIT, Cursor, Limit
from api.params import EnvironmentName, OptionalName, TaskId
from api.schemas.common import ERROR_RESPONSES
from api.schemas.tasks import TaskPublic, TasksImported, TasksPublic
from api.services import tasks

router = APIRouter(tags=["tasks"], dependencies=[Depends(current_token)], responses=ERROR_RESPONSES)

MAX_UPLOAD_BYTES = 256 * 2**20
UPLOAD_BODY = {"requestBody": {"required": True, "content": {
    "application/x-ndjson": {"schema": {"type": "string"}},
    "text/plain": {"schema": {"type": "string"}},
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                       "properties": {"file": {"type": "string", "format": "binary"}}}},
}}}


async def _upload_text(request: Request) -> str:
    """The JSONL text of a raw body or of the `file` field of a multipart form."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=4)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(422, "validation_error", "file: expected a JSONL file in the multipart field 'file', got none")
        raw = await upload.read(MAX_UPLOAD_BYTES + 1)
    else:
        raw = await request.body()
    if len(raw) > MAX_UPLOAD_BYTES:
        raise ApiError(413, "too_large", f"body: expected at most {MAX_UPLOAD_BYTES} bytes of JSONL, got more")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(422, "validation_error", f"body: expected UTF-8 JSONL, got invalid byte at {error.start}") from None


@router.post("/v1/environments/{name}/tasks", status_code=201, response_model=TasksImported, openapi_extra=UPLOAD_BODY,
             responses={413: ERROR_RESPONSES[422] | {"description": "The upload is too large."}})
async def upload_tasks(
    name: EnvironmentName, request: Request, session: SessionDep,
    format: Literal["crucible", "swebench"] = "crucible",
    repos_dir: Annotated[str | None, Query(max_length=4096, pattern=r"^/[^\x00]*$")] = None,
) -> dict[str, Any]:
    """Upload tasks as JSONL (a raw body or a multipart `file`); known external ids are updated."""
    text = await _upload_text(request)
    count = await run_in_threadpool(
        tasks.import_upload, session, environment=name, text=text, format=format, repos_dir=repos_dir)
    await run_in_threadpool(session.commit)
    return {"environment": name, "imported": count}


@router.get("/v1/tasks", response_model=TasksPublic)
def list_tasks(
    session: SessionDep, environment: OptionalName = None, split: OptionalName = None,
    difficulty: Literal["easy", "medium", "hard"] | None = None, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT,
) -> dict[str, Any]:
    """Task summaries (no payloads), oldest first."""
    data, next_cursor = tasks.list_tasks(session, environment=environment, split=split, difficulty=difficulty,
                                         cursor=cursor, limit=limit)
    return {"data": data, "next_cursor": next_cursor}


@router.get("/v1/tasks/{task_id}", response_model=TaskPublic)
def show_task(
    task_id: TaskId, session: SessionDep, elide_over: Annotated[int, Query(ge=0, le=2**31 - 1)] = tasks.ELIDE_OVER
) -> dict[str, Any]:
    """One task with its instruction and payload (long strings elided unless `elide_over=0`)."""
    return tasks.show_task(session, task_id=task_id, elide_over=elide_over)
