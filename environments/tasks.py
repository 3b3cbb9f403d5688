"""Import tasks into the store (upsert by environment and external id)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from core.models import Task
from environments.service import get_environment

TaskFormat = Literal["crucible", "swebench"]


def import_tasks(
    session: Session, *, environment: str, path: Path, format: TaskFormat = "crucible", repos_dir: Path | None = None,
) -> int:
    """Read `path` and upsert its tasks under `environment`. Returns how many tasks it holds."""
    env = get_environment(session, name=environment)
    if env.kind != "code_repo":
        from core.errors import ConfigError

        raise ConfigError(f"environment {environment!r} is a {env.kind} environment; only code_repo imports tasks yet")
    from environments.code_repo import importing

    if format == "swebench":
        records = importing.read_swebench_jsonl(path, repos_dir=repos_dir or path.parent)
    else:
        records = importing.read_crucible_jsonl(path)
    for record in records:
        statement = insert(Task).values(
            environment_name=environment, external_id=record.external_id, split=record.split,
            instruction=record.instruction, payload=record.payload, pass_rate_samples=0,
        )
        session.execute(statement.on_conflict_do_update(
            index_elements=[Task.environment_name, Task.external_id],
            set_={"instruction": record.instruction, "split": record.split, "payload": record.payload},
        ))
    return len(records)
