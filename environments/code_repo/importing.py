"""Turn task files into code_repo task payloads: on the client from local paths, on the server from data.

Crucible JSONL, one task a line:

    {"id": "fix-add", "instruction": "...", "split": "train", "repo": "repos/calc", "commit": null,
     "public_tests": {"paths": ["tests"]},
     "hidden_tests": {"paths": ["hidden_test.py"], "files": {"hidden_test.py": "..."}},
     "solution": {"files": {"calc.py": "..."}}}

`solution` (optional, never shown to the agent) is the reference solution: with it the hidden tests are
graded blinded (environments/code_repo/blinding.py).

On the client (`crucible tasks import`), `repo` may be a directory (packed as a tarball), a `.tar.gz`
or a git repository with `commit` (bundled without writing to it), relative to the file. What reaches
the store, and all the API accepts, is data: `repo` as `{"format": "tar" | "git_bundle", "data_b64": …}`,
checked by `snapshot.check_snapshot` before it is kept.

A task may instead run on its own image, whose repository is already in place: `"image":
"sweb.eval.x86_64.django__django-11099", "repo": {"format": "image", "path": "/testbed", "commit": "<sha>"}`.
The environment's `task_images` must allow the image; every setup checks that the image's repository is
exactly that commit with nothing after it (repo.check_image_repo).

SWE-bench JSONL (instance_id, repo, base_commit, problem_statement, test_patch, FAIL_TO_PASS,
PASS_TO_PASS) with the repositories cloned under `repos_dir/<owner>__<name>` or `repos_dir/<name>`, or,
with an image template (`--image 'swebench/sweb.eval.x86_64.{instance_key}:latest'`), on each instance's
own image with its repository at /testbed. The API reads a `repos_dir` only inside the operator's
CRUCIBLE_TASK_REPOS_ROOT.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.config_files import DataLimitError, check_data
from core.errors import ConfigError
from environments.code_repo.snapshot import (
    MAX_SNAPSHOT_BYTES,
    ImageRepo,
    RepoSnapshot,
    check_snapshot,
    pack_directory,
    pack_git,
    pack_tarball,
)
from environments.code_repo.task import CodeRepoTask, TestSpec

MAX_ID_CHARS = 256
MAX_SPLIT_CHARS = 64
MAX_INSTRUCTION_CHARS = 256 * 2**10
MAX_LINE_DEPTH = 16
MAX_LINE_STRING = MAX_SNAPSHOT_BYTES * 4 // 3 + 4
"""The longest string a line may hold: a base64 repository archive at its own limit."""


@dataclass(frozen=True)
class TaskRecord:
    external_id: str
    instruction: str
    split: str
    payload: dict[str, Any]


def json_lines(lines: Iterable[str], *, source: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(number, `source:number`, object) for each non-blank line; depth, surrogates and shape checked."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(line)
        except RecursionError:
            raise ConfigError(f"{where}: expected JSON nested at most {MAX_LINE_DEPTH} deep, got far deeper") from None
        except ValueError as error:
            raise ConfigError(f"{where}: expected one JSON object per line: {getattr(error, 'msg', error)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
        try:
            check_data(data, source=where, max_depth=MAX_LINE_DEPTH, max_string=MAX_LINE_STRING)
        except DataLimitError as error:
            raise ConfigError(str(error)) from None
        yield number, where, data


def _lines(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    try:
        with path.open(encoding="utf-8", errors="strict", newline="") as handle:
            yield from json_lines(handle, source=str(path))
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the task file ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: expected UTF-8 JSONL, got a byte that is not at {error.start}") from None


def _require(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise ConfigError(f"{where}: expected a {key!r} field, got only {sorted(data)[:20]}")
    return data[key]


def _text(data: dict[str, Any], key: str, where: str, *, limit: int, default: str | None = None) -> str:
    value = data.get(key, default) if default is not None else _require(data, key, where)
    if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
        raise ConfigError(f"{where}: {key}: expected a non-empty string, got {value!r:.80}")
    if len(str(value)) > limit:
        raise ConfigError(f"{where}: {key}: expected at most {limit} characters, got {len(str(value))}")
    return str(value)


def _record(data: dict[str, Any], snapshot: RepoSnapshot | ImageRepo, where: str, *, public: Any, hidden: Any,
            id_key: str, instruction_key: str, default_split: str, image: str | None = None) -> TaskRecord:
    if isinstance(snapshot, RepoSnapshot):
        check_snapshot(snapshot, where=f"{where}: repo")
    try:
        task = CodeRepoTask(repo=snapshot, public_tests=public, hidden_tests=hidden, image=image,
                            **{key: data[key] for key in ("protected_paths", "solution") if key in data})
    except ValidationError as error:
        first = error.errors()[0]
        raise ConfigError(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return TaskRecord(_text(data, id_key, where, limit=MAX_ID_CHARS),
                      _text(data, instruction_key, where, limit=MAX_INSTRUCTION_CHARS),
                      _text(data, "split", where, limit=MAX_SPLIT_CHARS, default=default_split),
                      task.model_dump(mode="json"))


def uploaded_snapshot(value: Any, where: str) -> RepoSnapshot | ImageRepo:
    """`repo` of an uploaded line: the archive itself (or the commit of the repository in the task's image),
    never a path on the server."""
    if not isinstance(value, dict):
        raise ConfigError(f'{where}: repo: expected an uploaded archive {{"format": "tar" or "git_bundle", '
                          f'"data_b64": …}} (the API reads no server paths; `crucible tasks import` packs a local '
                          f"directory), got {value!r:.80}")
    try:
        return ImageRepo.model_validate(value) if value.get("format") == "image" else RepoSnapshot.model_validate(value)
    except ValidationError as error:
        first = error.errors()[0]
        raise ConfigError(f"{where}: repo.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def _local_snapshot(base: Path, value: Any, commit: Any, where: str) -> RepoSnapshot | ImageRepo:
    """Client side: a path relative to the task file, packed here; or an archive already inline."""
    if isinstance(value, dict):
        return uploaded_snapshot(value, where)
    if not isinstance(value, str) or "\x00" in value:
        raise ConfigError(f"{where}: repo: expected a path or an archive object, got {value!r:.80}")
    repo = (base / value).resolve()
    if commit:
        return pack_git(repo, commit=str(commit))
    if repo.is_file() and repo.name.endswith((".tar.gz", ".tgz")):
        return pack_tarball(repo)
    if repo.is_dir():
        return pack_directory(repo)
    raise ConfigError(f"{where}: repo: expected a directory, a .tar.gz or a git repo with 'commit', got {str(repo)!r}")


def crucible_records(lines: Iterator[tuple[int, str, dict[str, Any]]], *, base: Path | None) -> Iterator[TaskRecord]:
    """Crucible lines → records. `base` None (the API): `repo` must be uploaded data."""
    for _, where, data in lines:
        raw = _require(data, "repo", where)
        snapshot = uploaded_snapshot(raw, where) if base is None else _local_snapshot(base, raw, data.get("commit"), where)
        yield _record(data, snapshot, where, public=data.get("public_tests"), hidden=_require(data, "hidden_tests", where),
                      id_key="id", instruction_key="instruction", default_split="train", image=_image(data, where))


def _image(data: dict[str, Any], where: str) -> str | None:
    image = data.get("image")
    if image is not None and not isinstance(image, str):
        raise ConfigError(f"{where}: image: expected an image tag such as 'sweb.eval.x86_64.astropy__astropy-12907', "
                          f"got {image!r:.80}")
    return image


def read_crucible_jsonl(path: Path) -> list[TaskRecord]:
    """Client side: read a local task file and pack the repositories it names."""
    return list(crucible_records(_lines(path), base=path.parent))


def _test_ids(value: Any, where: str) -> list[str]:
    ids = json.loads(value) if isinstance(value, str) else value
    if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
        raise ConfigError(f"{where}: expected a list of test ids, got {value!r:.80}")
    return ids


def find_repo(repos_dir: Path, name: str, where: str) -> Path:
    """The clone of `name` (`owner/name`) under `repos_dir`; a name that leaves it is refused, not followed."""
    root = repos_dir.resolve()
    if not name or "\x00" in name or name.startswith("/") or ".." in name.split("/"):
        raise ConfigError(f"{where}: repo: expected an owner/name like 'django/django', got {name[:200]!r}")
    for candidate in (root / name.replace("/", "__"), root / name.split("/")[-1], root / name):
        resolved = candidate.resolve()
        if not resolved.is_relative_to(root):
            raise ConfigError(f"{where}: repo {name[:200]!r}: expected a clone inside {root}, got a path that "
                              f"leads to {resolved}")
        if resolved.exists():
            return resolved
    raise ConfigError(f"{where}: repo {name[:200]!r}: expected a clone under {root} (as {name.replace('/', '__')})")


IMAGE_TEMPLATE = r"^[a-z0-9{][a-z0-9{}_./:@-]{0,299}$"
"""An image template as `--image` takes it: an image reference with `{instance_id}` or `{instance_key}`."""


def instance_image(template: str, instance_id: str, where: str) -> str:
    """The image of one SWE-bench instance: `{instance_id}` as given, `{instance_key}` as Docker Hub's
    swebench/ images spell it (lower case, `__` as `_1776_`). Literal replacement, not str.format: a format
    spec such as `{instance_id:1999999999}` would build gigabytes before any length check."""
    image = template.replace("{instance_id}", instance_id).replace(
        "{instance_key}", instance_id.lower().replace("__", "_1776_"))
    if "{" in template.replace("{instance_id}", "").replace("{instance_key}", "") or "}" in image:
        raise ConfigError(f"image: expected a template naming only {{instance_id}} or {{instance_key}}, got "
                          f"{template[:200]!r}")
    return image


def swebench_records(lines: Iterator[tuple[int, str, dict[str, Any]]], *, repos_dir: Path | None,
                     image: str | None = None) -> Iterator[TaskRecord]:
    """`image` (a template): each instance on its own image, its repository at /testbed at base_commit;
    else the clone under `repos_dir`, bundled at base_commit."""
    for _, where, data in lines:
        fail_to_pass = _test_ids(_require(data, "FAIL_TO_PASS", where), where)
        pass_to_pass = _test_ids(data.get("PASS_TO_PASS") or [], where)
        commit = str(_require(data, "base_commit", where))
        snapshot: RepoSnapshot | ImageRepo
        if image is not None:
            instance = _text(data, "instance_id", where, limit=MAX_ID_CHARS)
            tag = instance_image(image, instance, where)
            snapshot = uploaded_snapshot({"format": "image", "path": "/testbed", "commit": commit}, where)
        else:
            assert repos_dir is not None
            tag = None
            snapshot = pack_git(find_repo(repos_dir, str(_require(data, "repo", where)), where), commit=commit)
        hidden = TestSpec(tests=fail_to_pass + pass_to_pass, scoring="all",
                          patch=str(_require(data, "test_patch", where)))
        public = TestSpec(tests=pass_to_pass) if pass_to_pass else None
        yield _record(data, snapshot, where, public=public, hidden=hidden, id_key="instance_id",
                      instruction_key="problem_statement", default_split="test", image=tag)


def read_swebench_jsonl(path: Path, *, repos_dir: Path | None, image: str | None = None) -> list[TaskRecord]:
    return list(swebench_records(_lines(path), repos_dir=repos_dir, image=image))


def allowed_repos_dir(repos_dir: str, *, root: Path | None) -> Path:
    """A `repos_dir` from a request, if it resolves inside the operator's root; refused otherwise."""
    if root is None:
        raise ConfigError("repos_dir: expected no server path (CRUCIBLE_TASK_REPOS_ROOT is unset, so the API reads "
                          f"none; import from a client with `crucible tasks import`), got {repos_dir[:200]!r}")
    allowed = root.resolve()
    resolved = (allowed / repos_dir).resolve()  # an absolute repos_dir replaces the root and is checked the same
    if "\x00" in repos_dir or not resolved.is_relative_to(allowed):
        raise ConfigError(f"repos_dir: expected a directory inside {allowed}, got {repos_dir[:200]!r}")
    if not resolved.is_dir():
        raise ConfigError(f"repos_dir: expected a directory inside {allowed}, got {repos_dir[:200]!r} (not one)")
    return resolved
