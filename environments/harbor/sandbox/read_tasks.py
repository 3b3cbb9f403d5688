"""Run in the reader image (Python 3.13, the `harbor` package): each argument a task folder, read by harbor's own
task model; one JSON line per folder, {"error": ...} for one harbor refuses. Text files only (a test or solution
file that is not UTF-8 is an error naming it)."""

import importlib.metadata
import json
import sys
from pathlib import Path

from harbor.models.task.task import Task

MAX_FILE = 4 << 20


def files(root):
    found = {}
    if not root.is_dir():
        return found
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise ValueError(f"{path.relative_to(root.parent)}: a symbolic link (expected regular files)")
        if path.is_file():
            if path.stat().st_size > MAX_FILE:
                raise ValueError(f"{path.relative_to(root.parent)}: over {MAX_FILE >> 20} MiB")
            try:  # the bytes as they are (read_text would turn CRLF into LF)
                found[path.relative_to(root).as_posix()] = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path.relative_to(root.parent)}: not UTF-8 text") from None
    return found


def read(folder):
    task = Task(folder)
    if task.has_steps:
        raise ValueError("a multi-step task ([[steps]]): expected a single-step task")
    return {"name": task.name, "instruction": task.instruction,
            "config": task.config.model_dump(mode="json"),
            "tests": files(task.paths.tests_dir), "solution": files(task.paths.solution_dir),
            "harbor_version": importlib.metadata.version("harbor")}


for argument in sys.argv[1:]:
    try:
        document = read(Path(argument))
    except Exception as error:  # harbor's own words, for the operator
        document = {"error": f"{type(error).__name__}: {error}"[:2000]}
    print(json.dumps(document), flush=True)
