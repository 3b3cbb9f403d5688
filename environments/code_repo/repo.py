"""Put a task's repository into a sandbox's workspace as a git repo with a `crucible-base` tag,
and read back what the agent changed."""

from __future__ import annotations

import fnmatch
import shlex

from environments.base import Sandbox
from environments.code_repo.task import BUNDLE_REF, CodeRepoTask

WORKSPACE = "/workspace"
BASE_TAG = "crucible-base"
IGNORED = ("__pycache__/", "'*.pyc'", ".pytest_cache/")
GIT = "git -c user.name=crucible -c user.email=crucible@localhost -c init.defaultBranch=main"


class SetupError(RuntimeError):
    """The task could not be put in place: an infrastructure fault, never the agent's."""


def _run(sandbox: Sandbox, command: str, *, timeout: float = 120) -> str:
    step = sandbox.step(command, timeout=timeout)
    if step.exit_code != 0:
        raise SetupError(f"`{command}` exited {step.exit_code} ({step.status}): {step.output[-800:]}")
    return str(step.output)


def install_repo(sandbox: Sandbox, task: CodeRepoTask) -> None:
    """Unpack the snapshot into the workspace, add public test files, and commit that as the base."""
    snapshot = task.repo
    if snapshot.format == "tar":
        sandbox.put_files({"/tmp/crucible-repo.tar.gz": snapshot.data})
        _run(sandbox, f"cd {WORKSPACE} && tar -xzf /tmp/crucible-repo.tar.gz && rm /tmp/crucible-repo.tar.gz "
                      f"&& {GIT} init -q")
    else:
        sandbox.put_files({"/tmp/crucible-repo.bundle": snapshot.data})
        _run(sandbox, f"cd {WORKSPACE} && {GIT} init -q && {GIT} fetch -q /tmp/crucible-repo.bundle "
                      f"'{BUNDLE_REF}:refs/heads/main' && {GIT} checkout -q main && rm /tmp/crucible-repo.bundle")
    if task.public_tests and task.public_tests.files:
        sandbox.put_files({f"{WORKSPACE}/{path}": content.encode() for path, content in task.public_tests.files.items()})
    # Byproducts of running code are not part of a submission.
    _run(sandbox, f"cd {WORKSPACE} && printf '%s\\n' {' '.join(IGNORED)} >> .git/info/exclude")
    _run(sandbox, f"cd {WORKSPACE} && {GIT} add -A && {GIT} commit -q --allow-empty -m 'crucible base' "
                  f"&& {GIT} tag -f {BASE_TAG} >/dev/null")


def workspace_diff(sandbox: Sandbox) -> str:
    """Everything the agent changed since the base, untracked files included, as a binary-safe diff."""
    return _run(sandbox, f"cd {WORKSPACE} && {GIT} add -A >/dev/null 2>&1; {GIT} diff --cached --binary {BASE_TAG}")


def changed_paths(diff: str) -> list[str]:
    paths = []
    for line in diff.splitlines():
        if line.startswith("diff --git a/"):
            left, _, right = line[len("diff --git a/"):].partition(" b/")
            paths.extend({left, right})
    return sorted(set(paths))


def protected_changes(diff: str, globs: list[str]) -> list[str]:
    return [path for path in changed_paths(diff) if any(fnmatch.fnmatch(path, glob) for glob in globs)]


def apply_diff(sandbox: Sandbox, diff: str, *, name: str) -> None:
    if not diff.strip():
        return
    target = f"/tmp/{name}.patch"
    sandbox.put_files({target: diff.encode()})
    _run(sandbox, f"cd {WORKSPACE} && {GIT} apply --binary --whitespace=nowarn {shlex.quote(target)}")
