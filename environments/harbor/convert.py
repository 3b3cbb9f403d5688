"""Harbor folders to Crucible's code_repo tasks, and code_repo tasks to Harbor folders.

    records = harbor_records(read_tasks(folders))            # import: images built, workspaces exported
    folder = write_folder(out, external_id="calc-1", instruction=text, task=task, image=image, environment="calc")
    read_back({folder: (text, task.hidden_tests)})           # export: harbor reads each folder back

Import: the instruction is instruction.md as harbor reads it; the repository is the working directory's files in
the task's image; the hidden layer is tests/ (HarborTests), run only in a fresh grading sandbox. What the task's
solution/solve.sh does is not kept (a script, not a change Crucible could blind with).

Export: task.toml, instruction.md, environment/ (a Dockerfile from the task's image, its workspace copied in),
tests/ (test.sh runs the hidden pytest layer from the workspace and writes /logs/verifier/reward.txt: the share
of the layer's tests that passed, or 1 only if all did, as its `scoring` says), and solution/solve.sh when the
task has a reference solution.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.errors import ConfigError
from environments.code_repo.importing import MAX_ID_CHARS, MAX_INSTRUCTION_CHARS, TaskRecord
from environments.code_repo.task import CodeRepoTask, HarborTests, ImageRepo, TestSpec
from environments.harbor.images import adapted_image, environment_image, export_workdir, workdir_of
from environments.harbor.reader import HarborRead

MAX_TIMEOUT_S = 3600.0


def harbor_records(reads: list[HarborRead], *, image: str | None = None, split: str = "train") -> Iterator[TaskRecord]:
    """One code_repo task line per folder harbor read (each image built or found first). `image`: a local image
    for every task instead of its own, a template where `{name}` is the task's name."""
    for read in reads:
        where = str(read.folder)
        if not read.instruction.strip() or len(read.instruction) > MAX_INSTRUCTION_CHARS:
            raise ConfigError(f"{where}: instruction.md: expected 1 to {MAX_INSTRUCTION_CHARS} characters, "
                              f"got {len(read.instruction.strip())}")
        if len(read.name) > MAX_ID_CHARS:
            raise ConfigError(f"{where}: name: expected at most {MAX_ID_CHARS} characters, got {len(read.name)}")
        verifier = read.config.get("verifier") or {}
        env = verifier.get("env") or {}
        for name, value in env.items():
            if "${" in str(value):
                raise ConfigError(f"{where}: [verifier].env: {name}: expected a literal value, got {str(value)[:80]!r} "
                                  "(the machine's variables never reach a grading sandbox)")
        named = image.replace("{name}", read.name) if image else None
        environment = environment_image(read, image=named)
        workdir = workdir_of(read, environment)
        snapshot = export_workdir(environment, workdir)  # checked as it was packed (pack_directory)
        try:
            tests = HarborTests(format="harbor", files=read.tests, workdir=workdir, env=env,
                                timeout_s=min(float(verifier.get("timeout_sec") or 600.0), MAX_TIMEOUT_S))
            task = CodeRepoTask(repo=snapshot, image=adapted_image(environment, workdir=workdir), hidden_tests=tests)
        except ValidationError as error:
            first = error.errors()[0]
            field, message = ".".join(map(str, first["loc"])), first["msg"].removeprefix("Value error, ")
            raise ConfigError(f"{where}: {message if message.startswith(field) else f'{field}: {message}'}") from None
        yield TaskRecord(read.name, read.instruction, split, task.model_dump(mode="json"))


def folder_name(external_id: str) -> str:
    """A task's folder name (harbor names a task without [task] by its folder)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", external_id).strip(".-")[:120] or "task"


def write_folder(out: Path, *, external_id: str, instruction: str, task: CodeRepoTask, image: str,
                 environment: str) -> Path:
    """`out/<name>`: the task as a Harbor folder. ConfigError for a task whose hidden layer is not pytest's."""
    spec = task.hidden_tests
    if not isinstance(spec, TestSpec):
        raise ConfigError(f"task {external_id!r}: expected a pytest layer to export, got a Harbor task's own tests "
                          "(export its source folder instead)")
    folder = out / folder_name(external_id)
    if folder.exists():
        raise ConfigError(f"{folder}: expected a new folder, got one that exists")
    workdir = task.repo.path if isinstance(task.repo, ImageRepo) else "/workspace"
    files: dict[str, str | bytes] = {
        "instruction.md": instruction,
        "task.toml": _task_toml(external_id=external_id, environment=environment, spec=spec, workdir=workdir),
        "tests/test.sh": _test_sh(spec, workdir=workdir),
        "tests/reward.py": REWARD_PY,
        "environment/Dockerfile": f"FROM {image}\nUSER root\n"
                                  + ("" if isinstance(task.repo, ImageRepo) else
                                     "COPY workspace/ /workspace/\nRUN chown -R 1000:1000 /workspace\n")
                                  + f"WORKDIR {workdir}\n",
    }
    for path, text in spec.files.items():
        files[f"tests/files/{path}"] = text
    if spec.patch:
        files["tests/test.patch"] = spec.patch
    if not isinstance(task.repo, ImageRepo):
        for path, data in _snapshot_files(task):
            files[f"environment/workspace/{path}"] = data
    if task.solution is not None:
        files["solution/solve.sh"] = _solve_sh(task, workdir=workdir)
    (folder / "environment" / "workspace").mkdir(parents=True)  # COPY needs it, files or none
    for path, content in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        if path.endswith(".sh"):
            target.chmod(0o755)
    return folder


def _toml(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string or number is a TOML basic string or number


def _task_toml(*, external_id: str, environment: str, spec: TestSpec, workdir: str) -> str:
    return (f'version = "1.0"\n\n[metadata]\nsource = "crucible"\nenvironment = {_toml(environment)}\n'
            f"external_id = {_toml(external_id)}\n\n[verifier]\ntimeout_sec = {_toml(float(spec.timeout_s))}\n\n"
            f"[environment]\nworkdir = {_toml(workdir)}\nallow_internet = false\n")


REWARD_PY = '''"""Crucible's reward from pytest's JUnit XML: argv[1] the report, argv[2] `fraction` or `all`."""
import sys
import xml.etree.ElementTree as ET

cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
passed = sum(1 for case in cases if not any(child.tag in ("failure", "error", "skipped") for child in case))
if sys.argv[2] == "all":
    print(1 if cases and passed == len(cases) else 0)
else:
    print(passed / len(cases) if cases else 0)
'''


def _test_sh(spec: TestSpec, *, workdir: str) -> str:
    patch = 'git apply --whitespace=nowarn /tests/test.patch || patch -p1 < /tests/test.patch\n' if spec.patch else ""
    copy = "cp -r /tests/files/. .\n" if spec.files else ""
    selected = " ".join(shlex.quote(item) for item in (spec.tests or spec.collect_paths()))
    # Without named ids, what pytest collects is the submission's to pad: 1 only if every test passed.
    scoring = spec.scoring if spec.tests else "all"
    pythonpath = ":".join(f"{workdir}/{path}".rstrip("/.") for path in spec.pythonpath)
    return ("#!/bin/bash\n# Crucible's hidden tests of this task: pytest on the layer's tests, the reward the share that "
            "passed.\nmkdir -p /logs/verifier\n"
            f"cd {shlex.quote(workdir)} || {{ echo 0 > /logs/verifier/reward.txt; exit 0; }}\n{copy}{patch}"
            f"PYTHONPATH={shlex.quote(pythonpath)} python3 -m pytest -q -p no:cacheprovider -c /dev/null "
            f"--rootdir={shlex.quote(workdir)} --junitxml=/logs/verifier/junit.xml -- {selected}\n"
            f"python3 /tests/reward.py /logs/verifier/junit.xml {scoring} > /logs/verifier/reward.txt "
            "|| echo 0 > /logs/verifier/reward.txt\n")


def _solve_sh(task: CodeRepoTask, *, workdir: str) -> str:
    assert task.solution is not None
    lines = ["#!/bin/bash", "# The task's reference solution, written over the working directory.", "set -e",
             f"cd {shlex.quote(workdir)}"]
    for path, text in task.solution.files.items():
        encoded = base64.b64encode(text.encode()).decode()
        lines.append(f"mkdir -p \"$(dirname {shlex.quote(path)})\" && echo {encoded} | base64 -d > {shlex.quote(path)}")
    if task.solution.patch:
        encoded = base64.b64encode(task.solution.patch.encode()).decode()
        lines.append(f"echo {encoded} | base64 -d | patch -p1")
    return "\n".join(lines) + "\n"


def _snapshot_files(task: CodeRepoTask) -> Iterator[tuple[str, bytes]]:
    snapshot = task.snapshot()
    if snapshot.format != "tar":
        raise ConfigError("export: expected a task whose repository is a tar archive or in its image, got a git "
                          "bundle (re-import it from a folder)")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(snapshot.data_b64))) as tar:
        for member in tar.getmembers():
            if member.isfile():
                handle = tar.extractfile(member)
                if handle is not None:
                    yield member.name.removeprefix("./"), handle.read()


def read_back(folders: dict[Path, tuple[str, TestSpec]], *, image: str | None = None) -> list[HarborRead]:
    """Have harbor read the written folders; ConfigError unless each reads back with our instruction, the
    tests we wrote and our time limit."""
    from environments.harbor.reader import read_tasks

    reads = read_tasks(list(folders), image=image)
    for read in reads:
        instruction, spec = folders[read.folder]
        verifier = read.config.get("verifier") or {}
        problems = [what for what, ok in (
            ("instruction.md", read.instruction == instruction),
            ("tests/test.sh", "test.sh" in read.tests),
            ("[verifier].timeout_sec", float(verifier.get("timeout_sec") or 0) == float(spec.timeout_s)),
        ) if not ok]
        if problems:
            raise ConfigError(f"{read.folder}: harbor read it back with another {', '.join(problems)}")
    return reads
