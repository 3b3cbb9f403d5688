"""Import tasks into the store (upsert by environment and external id).

    import_tasks(session, environment="calc", path=Path("tasks.jsonl"))          # client: packs local repos
    import_uploaded(session, environment="calc", lines=handle, repos_root=None)  # server: data only

Both store records one at a time as they are read (an upload is never held whole), inside the caller's
transaction: a bad line anywhere stores nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from core.errors import ConfigError
from core.models import Task
from environments.service import get_environment

if TYPE_CHECKING:
    from environments.code_repo.importing import TaskRecord

TaskFormat = Literal["crucible", "swebench"]


def _check_kind(session: Session, environment: str) -> None:
    env = get_environment(session, name=environment)
    if env.kind != "code_repo":
        raise ConfigError(f"environment {environment!r} is a {env.kind} environment; only code_repo imports tasks yet")


def _store(session: Session, *, environment: str, records: Iterable[TaskRecord]) -> int:
    count = 0
    for record in records:
        statement = insert(Task).values(
            environment_name=environment, external_id=record.external_id, split=record.split,
            instruction=record.instruction, payload=record.payload, pass_rate_samples=0,
        )
        session.execute(statement.on_conflict_do_update(
            index_elements=[Task.environment_name, Task.external_id],
            set_={"instruction": record.instruction, "split": record.split, "payload": record.payload},
        ))
        count += 1
    return count


def import_tasks(
    session: Session, *, environment: str, path: Path, format: TaskFormat = "crucible", repos_dir: Path | None = None,
) -> int:
    """Client side: read `path`, pack the local repositories it names, upsert. Returns how many tasks."""
    _check_kind(session, environment)
    from environments.code_repo import importing

    if format == "swebench":
        records = importing.read_swebench_jsonl(path, repos_dir=repos_dir or path.parent)
    else:
        records = importing.read_crucible_jsonl(path)
    return _store(session, environment=environment, records=records)


def import_uploaded(
    session: Session, *, environment: str, lines: Iterable[str], format: TaskFormat = "crucible",
    repos_dir: str | None = None, repos_root: Path | None = None, source: str = "line",
) -> int:
    """Server side: upsert uploaded JSONL. Repositories are uploaded archives; a SWE-bench `repos_dir`
    is read only inside `repos_root` (the operator's CRUCIBLE_TASK_REPOS_ROOT)."""
    _check_kind(session, environment)
    from environments.code_repo import importing

    parsed = importing.json_lines(lines, source=source)
    if format == "swebench":
        if repos_dir is None:
            raise ConfigError("repos_dir: expected the directory (inside CRUCIBLE_TASK_REPOS_ROOT) holding the "
                              "SWE-bench clones, got none")
        directory = importing.allowed_repos_dir(repos_dir, root=repos_root)
        records = importing.swebench_records(parsed, repos_dir=directory)
    else:
        if repos_dir is not None:
            raise ConfigError(f"repos_dir: expected none for format=crucible, got {repos_dir[:200]!r}")
        records = importing.crucible_records(parsed, base=None)
    count = _store(session, environment=environment, records=records)
    if count == 0:
        raise ConfigError("body: expected JSONL (one task object per line), got an empty upload")
    return count
