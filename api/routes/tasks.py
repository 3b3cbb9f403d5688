"""`/v1/tasks` and `/v1/environments/{name}/tasks`: upload JSONL, list with filters, show one."""

from __future__ import annotations

import tempfile
from typing import Annotated, BinaryIO, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from api.deps import SessionDep, current_token
from api.errors import ApiError
from api.limits import streamed_upload
from api.pagination import DEFAULT_LIMIT, Cursor, Limit
from api.params import EnvironmentName, OptionalName, TaskId
from api.schemas.common import ERROR_RESPONSES
from api.schemas.tasks import TaskPublic, TasksImported, TasksPublic
from api.services import tasks
from core.termination import Bucket

router = APIRouter(tags=["tasks"], dependencies=[Depends(current_token)], responses=ERROR_RESPONSES)

UPLOAD_BODY = {"requestBody": {"required": True, "content": {
    "application/x-ndjson": {"schema": {"type": "string"}},
    "text/plain": {"schema": {"type": "string"}},
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                       "properties": {"file": {"type": "string", "format": "binary"}}}},
}}}
SPOOL_IN_MEMORY_BYTES = 2**20


async def _spooled_upload(request: Request) -> BinaryIO:
    """The JSONL bytes of a raw body or of the `file` field of a multipart form, in a spooled temp file.

    The body streams in chunk by chunk (never whole in memory) and `api.limits` stops it at
    CRUCIBLE_API_MAX_UPLOAD_BYTES as it arrives."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=4)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(422, "validation_error", "file: expected a JSONL file in the multipart field 'file', got none")
        await upload.seek(0)
        return upload.file
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115 - returned open
    async for chunk in request.stream():
        await run_in_threadpool(spool.write, chunk)
    spool.seek(0)
    return spool  # type: ignore[return-value]


@router.post("/v1/environments/{name}/tasks", status_code=201, response_model=TasksImported, openapi_extra=UPLOAD_BODY,
             responses={413: ERROR_RESPONSES[413] | {"description": "The upload is larger than CRUCIBLE_API_MAX_UPLOAD_BYTES."}})
@streamed_upload
async def upload_tasks(
    name: EnvironmentName, request: Request, session: SessionDep,
    format: Literal["crucible", "swebench"] = "crucible",
    repos_dir: Annotated[str | None, Query(max_length=4096, pattern=r"^[^\x00]*$")] = None,
    image: Annotated[str | None, Query(max_length=300, description=(
        "swebench only: each instance's own image, as a template with {instance_id} or {instance_key} "
        "(its repository at /testbed; the environment's task_images must allow it)"))] = None,
) -> TasksImported:
    """Upload tasks as JSONL (a raw body or a multipart `file`); known external ids are updated.

    Repositories travel in the upload (`repo: {"format": "tar" | "git_bundle", "data_b64": …}`); the
    API reads no server path, except a SWE-bench `repos_dir` inside CRUCIBLE_TASK_REPOS_ROOT."""
    upload = await _spooled_upload(request)
    try:
        count = await run_in_threadpool(
            tasks.import_upload, session, environment=name, upload=upload, format=format, repos_dir=repos_dir,
            image=image)
    finally:
        upload.close()
    await run_in_threadpool(session.commit)
    return TasksImported(environment=name, imported=count)


@router.get("/v1/tasks", response_model=TasksPublic)
def list_tasks(
    session: SessionDep, environment: OptionalName = None, split: OptionalName = None,
    difficulty: Bucket | None = None, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT,
) -> TasksPublic:
    """Task summaries (no payloads), oldest first."""
    data, next_cursor = tasks.list_tasks(session, environment=environment, split=split, difficulty=difficulty,
                                         cursor=cursor, limit=limit)
    return TasksPublic(data=data, next_cursor=next_cursor)


@router.get("/v1/tasks/{task_id}", response_model=TaskPublic)
def show_task(
    task_id: TaskId, session: SessionDep, elide_over: Annotated[int, Query(ge=0, le=2**31 - 1)] = tasks.ELIDE_OVER
) -> TaskPublic:
    """One task with its instruction and payload (long strings elided unless `elide_over=0`)."""
    return tasks.show_task(session, task_id=task_id, elide_over=elide_over)
