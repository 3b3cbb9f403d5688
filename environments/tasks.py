"""Import tasks into the store (upsert by environment and external id).

    import_tasks(session, environment="calc", path=Path("tasks.jsonl"))          # client: packs local repos
    import_uploaded(session, environment="calc", lines=handle, repos_root=None)  # server: data only
    import_generated(session, environment="miniwob", format="miniwob", tasks="all", seeds=10)  # browser

Each kind names the formats it imports (`formats`): code_repo `crucible` and `swebench` files; the kinds whose
tasks are payloads `crucible` files of environments.task_lines; browser also the generated formats of
environments.browser.importing (`miniwob`, and one per self-hosted site).

Both store records one at a time as they are read (an upload is never held whole), inside the caller's
transaction: a bad line anywhere stores nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from core.errors import ConfigError
from core.models import Task
from environments.registry import get_kind
from environments.service import get_environment, spec_of
from environments.task_lines import payload_kinds, payload_records, read_payload_file

if TYPE_CHECKING:
    from environments.code_repo.importing import TaskRecord

TaskFormat = Literal["crucible", "swebench"]
"""The formats of a task file (a Harbor task is a folder: import_harbor)."""


def _check_kind(session: Session, environment: str, format: str) -> str:
    """The environment's kind, if it imports `format`."""
    env = get_environment(session, name=environment)
    allowed = get_kind(env.kind).formats
    if not allowed:
        raise ConfigError(f"environment {environment!r} is a {env.kind} environment; no format imports its tasks yet")
    if format not in allowed:
        raise ConfigError(f"format: expected {', '.join(allowed)} for {environment!r} (a {env.kind} environment), "
                          f"got {format[:80]!r}")
    return env.kind


def _store(session: Session, *, environment: str, records: Iterable[TaskRecord]) -> int:
    spec = spec_of(get_environment(session, name=environment))
    count = 0
    for record in records:
        image = record.payload.get("image")
        if image is not None and not spec.allows_task_image(image):
            allowed = ", ".join(spec.task_images) or f"none: {environment!r} has no task_images"
            raise ConfigError(f"task {record.external_id[:200]!r}: image: expected an image the environment allows "
                              f"({allowed}), got {str(image)[:300]!r}")
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


def _check_image_option(image: str | None, *, format: str, repos_dir: object) -> None:
    """`image` (a SWE-bench image template) goes with format swebench and without repos_dir."""
    import re

    from environments.code_repo.importing import IMAGE_TEMPLATE

    if image is None:
        return
    if format != "swebench":
        raise ConfigError(f"image: expected only with format swebench (a crucible line names its own image), "
                          f"got it with format {format[:80]!r}")
    if repos_dir is not None:
        raise ConfigError(f"repos_dir: expected none with an image template (the repository is in each image), "
                          f"got {str(repos_dir)[:200]!r}")
    if not re.fullmatch(IMAGE_TEMPLATE, image):
        raise ConfigError("image: expected an image reference template such as "
                          f"'swebench/sweb.eval.x86_64.{{instance_key}}:latest', got {image[:200]!r}")


def import_tasks(
    session: Session, *, environment: str, path: Path, format: TaskFormat = "crucible", repos_dir: Path | None = None,
    image: str | None = None,
) -> int:
    """Client side: read `path`, pack the local repositories it names, upsert. Returns how many tasks.
    `image`: a SWE-bench image template; each instance then runs on its own image."""
    kind = _check_kind(session, environment, format)
    _check_image_option(image, format=format, repos_dir=repos_dir)
    from environments.code_repo import importing

    if kind in payload_kinds():
        records: Iterable[TaskRecord] = read_payload_file(path, kind=kind)
    elif format == "swebench":
        records = importing.read_swebench_jsonl(path, repos_dir=None if image else repos_dir or path.parent,
                                                image=image)
    else:
        records = importing.read_crucible_jsonl(path)
    return _store(session, environment=environment, records=records)


def import_harbor(session: Session, *, environment: str, folders: list[Path], image: str | None = None,
                  split: str = "train") -> int:
    """Client side: Harbor task folders read by the `harbor` package (environments/harbor), each task's image
    built (or `image`, a local one, `{name}` the task's name), upserted as code_repo tasks."""
    _check_kind(session, environment, "harbor")
    from environments.harbor.convert import harbor_records
    from environments.harbor.reader import read_tasks

    return _store(session, environment=environment, records=harbor_records(read_tasks(folders), image=image,
                                                                            split=split))


def import_uploaded(
    session: Session, *, environment: str, lines: Iterable[str], format: TaskFormat = "crucible",
    repos_dir: str | None = None, repos_root: Path | None = None, source: str = "line", image: str | None = None,
) -> int:
    """Server side: upsert uploaded JSONL. Repositories are uploaded archives; a SWE-bench `repos_dir`
    is read only inside `repos_root` (the operator's CRUCIBLE_TASK_REPOS_ROOT); with `image` (a template)
    each instance's repository is the one in its own image."""
    kind = _check_kind(session, environment, format)
    _check_image_option(image, format=format, repos_dir=repos_dir)
    from environments.code_repo import importing

    parsed = importing.json_lines(lines, source=source)
    if kind in payload_kinds():
        if repos_dir is not None:
            raise ConfigError(f"repos_dir: expected none for a {kind} environment, got {repos_dir[:200]!r}")
        records: Iterable[TaskRecord] = payload_records(parsed, kind=kind)
    elif format == "swebench" and image is not None:
        records = importing.swebench_records(parsed, repos_dir=None, image=image)
    elif format == "swebench":
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


def import_generated(session: Session, *, environment: str, format: str, **options: Any) -> int:
    """Generate a browser environment's tasks (`miniwob` names × seeds, a site's `count` tasks from
    `start`) and upsert them; `options` as environments.browser.importing.generated_records takes them."""
    _check_kind(session, environment, format)
    from environments.browser.importing import generated_records

    return _store(session, environment=environment, records=generated_records(format, **options))
