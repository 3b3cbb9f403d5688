"""Turn task files into code_repo task payloads.

Crucible JSONL, one task a line (paths relative to the file):

    {"id": "fix-add", "instruction": "...", "split": "train", "repo": "repos/calc", "commit": null,
     "public_tests": {"command": "python -m pytest -q tests"},
     "hidden_tests": {"command": "python -m pytest -q hidden_test.py", "files": {"hidden_test.py": "..."}}}

`repo` is a directory (packed as a tarball), a `.tar.gz`, or a git repository with `commit`.

SWE-bench JSONL (instance_id, repo, base_commit, problem_statement, test_patch, FAIL_TO_PASS,
PASS_TO_PASS) with the repositories cloned under `repos_dir/<owner>__<name>` or `repos_dir/<name>`.
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.errors import ConfigError
from environments.code_repo.task import CodeRepoTask, RepoSnapshot, TestSpec, pack_directory, pack_git


@dataclass(frozen=True)
class TaskRecord:
    external_id: str
    instruction: str
    split: str
    payload: dict[str, Any]


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the task file ({error.strerror})") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}:{number}: expected one JSON object per line: {error.msg}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object, got {type(data).__name__}")
        yield number, data


def _require(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise ConfigError(f"{where}: expected a {key!r} field, got only {sorted(data)}")
    return data[key]


def _snapshot(repo: Path, commit: str | None, where: str) -> RepoSnapshot:
    if commit:
        return pack_git(repo, commit=commit)
    if repo.is_file() and repo.name.endswith((".tar.gz", ".tgz")):
        return RepoSnapshot(format="tar", data_b64=base64.b64encode(repo.read_bytes()).decode())
    if repo.is_dir():
        return pack_directory(repo)
    raise ConfigError(f"{where}: repo: expected a directory, a .tar.gz or a git repo with 'commit', got {str(repo)!r}")


def read_crucible_jsonl(path: Path) -> list[TaskRecord]:
    records = []
    for number, data in _lines(path):
        where = f"{path}:{number}"
        repo = (path.parent / str(_require(data, "repo", where))).resolve()
        try:
            task = CodeRepoTask(
                repo=_snapshot(repo, data.get("commit"), where),
                public_tests=data.get("public_tests"), hidden_tests=_require(data, "hidden_tests", where),
                **({"protected_paths": data["protected_paths"]} if "protected_paths" in data else {}),
            )
        except ValidationError as error:
            first = error.errors()[0]
            raise ConfigError(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        records.append(TaskRecord(str(_require(data, "id", where)), str(_require(data, "instruction", where)),
                                  str(data.get("split", "train")), task.model_dump(mode="json")))
    return records


def _test_ids(value: Any) -> list[str]:
    return json.loads(value) if isinstance(value, str) else list(value or [])


def _find_repo(repos_dir: Path, name: str, where: str) -> Path:
    for candidate in (repos_dir / name.replace("/", "__"), repos_dir / name.split("/")[-1], repos_dir / name):
        if candidate.exists():
            return candidate
    raise ConfigError(f"{where}: repo {name!r}: expected a clone under {repos_dir} (as {name.replace('/', '__')})")


def read_swebench_jsonl(path: Path, *, repos_dir: Path) -> list[TaskRecord]:
    records = []
    for number, data in _lines(path):
        where = f"{path}:{number}"
        fail_to_pass = _test_ids(_require(data, "FAIL_TO_PASS", where))
        pass_to_pass = _test_ids(data.get("PASS_TO_PASS"))
        repo = _find_repo(repos_dir, str(_require(data, "repo", where)), where)
        snapshot = pack_git(repo, commit=str(_require(data, "base_commit", where)))
        hidden = TestSpec(command="python3 -m pytest -q -p no:cacheprovider "
                                  + " ".join(shlex.quote(t) for t in fail_to_pass + pass_to_pass),
                          patch=str(_require(data, "test_patch", where)))
        public = (TestSpec(command="python3 -m pytest -q -p no:cacheprovider "
                                   + " ".join(shlex.quote(t) for t in pass_to_pass)) if pass_to_pass else None)
        task = CodeRepoTask(repo=snapshot, public_tests=public, hidden_tests=hidden)
        records.append(TaskRecord(str(_require(data, "instance_id", where)),
                                  str(_require(data, "problem_statement", where)),
                                  str(data.get("split", "test")), task.model_dump(mode="json")))
    return records
