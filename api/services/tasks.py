"""Tasks for the API: import an uploaded JSONL file (data only), list with filters (paged by id), show one."""

from __future__ import annotations

import io
from typing import Any, BinaryIO

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from api.pagination import decode_cursor, page
from api.schemas.tasks import TaskPublic, TaskSummary
from api.services.run_grading import HIDDEN_LAYER_RECORDS
from core.errors import ConfigError, NotFound
from core.models import Task
from core.settings import get_settings
from core.termination import Bucket
from environments.tasks import TaskFormat, import_uploaded

ELIDE_OVER = 2000


def import_upload(
    session: Session, *, environment: str, upload: BinaryIO, format: TaskFormat, repos_dir: str | None,
    image: str | None = None,
) -> int:
    """Import an uploaded JSONL file line by line; returns how many tasks it holds.

    Every repository is data in the upload (checked by environments.code_repo.snapshot); a SWE-bench
    `repos_dir` is read only inside CRUCIBLE_TASK_REPOS_ROOT."""
    lines = io.TextIOWrapper(upload, encoding="utf-8", errors="strict", newline="")
    try:
        return import_uploaded(session, environment=environment, lines=lines, format=format, repos_dir=repos_dir,
                               repos_root=get_settings().task_repos_root, image=image)
    except UnicodeDecodeError as error:
        raise ConfigError(f"body: expected UTF-8 JSONL, got an invalid byte ({error.reason})") from None
    finally:
        lines.detach()


def list_tasks(
    session: Session, *, environment: str | None, split: str | None, difficulty: str | None,
    cursor: str | None, limit: int,
) -> tuple[list[TaskSummary], str | None]:
    after = decode_cursor(cursor, types=[int])
    query = select(Task).order_by(Task.id)
    for column, value in ((Task.environment_name, environment), (Task.split, split)):
        if value is not None:
            query = query.where(column == value)
    if difficulty == Bucket.UNKNOWN:  # not measured yet
        query = query.where(Task.difficulty.is_(None))
    elif difficulty is not None:
        query = query.where(Task.difficulty == difficulty)
    if after is not None:
        query = query.where(Task.id > after[0])
    rows = list(session.execute(query.limit(limit + 1)).scalars())
    kept, next_cursor = page(rows, limit=limit, key=lambda row: [row.id])
    return [TaskSummary.model_validate(row) for row in kept], next_cursor


def elide(value: Any, *, over: int) -> Any:
    """A copy of `value` with every string longer than `over` replaced by a short marker."""
    if isinstance(value, str) and len(value) > over:
        return f"<{len(value)} characters elided; ?elide_over=0 shows them>"
    if isinstance(value, dict):
        return {key: elide(item, over=over) for key, item in value.items()}
    if isinstance(value, list):
        return [elide(item, over=over) for item in value]
    return value


def show_task(session: Session, *, task_id: int, elide_over: int = ELIDE_OVER) -> TaskPublic:
    row = session.get(Task, task_id)
    if row is None:
        raise NotFound(f"no task with id {task_id}; GET /v1/tasks lists them")
    data = {column.key: getattr(row, column.key) for column in Task.__table__.columns}
    if elide_over > 0:
        data["payload"] = elide(row.payload, over=elide_over)
    return TaskPublic.model_validate(data)


_BLINDING = text("""
SELECT DISTINCT ON (e.task_id) e.task_id, (layer->'record'->>'blinded')::bigint AS blinded,
       (layer->'record'->>'graded')::bigint AS graded
FROM episodes AS e""" + HIDDEN_LAYER_RECORDS + """AND e.task_id = ANY(:ids)
ORDER BY e.task_id, e.id DESC
""")


def blinding_by_task(session: Session, *, task_ids: list[int]) -> dict[int, str]:
    """Per code_repo task, what its hidden tests' grading keeps out of the sandbox: `n/m` tests blinded in
    its latest grade, `unblinded: no reference solution` (or a Harbor task's test.sh), or `not graded yet` (tasks of
    other kinds: none)."""
    if not task_ids:
        return {}
    graded = {int(row.task_id): f"{row.blinded}/{row.graded}"
              for row in session.execute(_BLINDING, {"ids": task_ids})}
    rows = session.execute(select(Task.id, Task.payload["hidden_tests"].isnot(None), Task.payload["solution"],
                                  Task.payload["hidden_tests"]["format"].astext).where(Task.id.in_(task_ids))).all()
    out: dict[int, str] = {}
    for task_id, code_repo, solution, layer in rows:
        if not code_repo:
            continue
        ungraded = ("unblinded: a Harbor task's tests/test.sh" if layer == "harbor"
                    else "unblinded: no reference solution" if not solution else "not graded yet")
        out[task_id] = graded.get(task_id) or ungraded
    return out
