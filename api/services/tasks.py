"""Tasks for the API: import an uploaded JSONL file, list with filters (paged by id), show one."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.pagination import decode_cursor, page
from core.errors import ConfigError, NotFound
from core.models import Task
from environments.tasks import TaskFormat, import_tasks

ELIDE_OVER = 2000


def _check_repo_paths(text: str) -> None:
    """An upload has no directory of its own: every `repo` must be an absolute path on the server."""
    for number, line in enumerate(text.splitlines(), 1):
        try:
            data = json.loads(line) if line.strip() else None
        except ValueError:
            continue  # the importer reports malformed lines with their number
        repo = data.get("repo") if isinstance(data, dict) else None
        if isinstance(repo, str) and not repo.startswith("/"):
            raise ConfigError(f"line {number}: repo: expected an absolute path on the API server, got {repo!r}")


def import_upload(
    session: Session, *, environment: str, text: str, format: TaskFormat, repos_dir: str | None
) -> int:
    """Write the upload to a temporary file and import it; returns how many tasks it holds."""
    if not text.strip():
        raise ConfigError("body: expected JSONL (one task object per line), got an empty upload")
    if "\x00" in text:
        raise ConfigError("body: expected text, got a NUL byte")
    if format == "crucible":
        _check_repo_paths(text)
    with tempfile.TemporaryDirectory(prefix="crucible-upload-") as directory:
        path = Path(directory) / "tasks.jsonl"
        path.write_text(text)
        try:
            return import_tasks(session, environment=environment, path=path, format=format,
                                repos_dir=Path(repos_dir) if repos_dir else None)
        except (ValueError, OSError) as error:  # a path the filesystem refuses
            raise ConfigError(f"body: cannot read a task's files: {error}") from None


def list_tasks(
    session: Session, *, environment: str | None, split: str | None, difficulty: str | None,
    cursor: str | None, limit: int,
) -> tuple[list[Task], str | None]:
    after = decode_cursor(cursor, types=[int])
    query = select(Task).order_by(Task.id)
    for column, value in ((Task.environment_name, environment), (Task.split, split), (Task.difficulty, difficulty)):
        if value is not None:
            query = query.where(column == value)
    if after is not None:
        query = query.where(Task.id > after[0])
    rows = list(session.execute(query.limit(limit + 1)).scalars())
    return page(rows, limit=limit, key=lambda row: [row.id])


def elide(value: Any, *, over: int) -> Any:
    """A copy of `value` with every string longer than `over` replaced by a short marker."""
    if isinstance(value, str) and len(value) > over:
        return f"<{len(value)} characters elided; ?elide_over=0 shows them>"
    if isinstance(value, dict):
        return {key: elide(item, over=over) for key, item in value.items()}
    if isinstance(value, list):
        return [elide(item, over=over) for item in value]
    return value


def show_task(session: Session, *, task_id: int, elide_over: int = ELIDE_OVER) -> dict[str, Any]:
    row = session.get(Task, task_id)
    if row is None:
        raise NotFound(f"no task with id {task_id}; GET /v1/tasks lists them")
    data = {column.key: getattr(row, column.key) for column in Task.__table__.columns}
    if elide_over > 0:
        data["payload"] = elide(row.payload, over=elide_over)
    return data
