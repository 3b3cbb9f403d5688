"""The trusted side of blinded grading: the hidden tests run on the task's reference solution.

    why = unblinded_reason(task, enabled=config.blind_hidden_tests)   # "" when the task can be blinded
    key = reference_key(task, base=base, open_sandbox=open_sandbox)  # blinding.Key, cached per task

A fresh sandbox holds the base, the reference solution, the test patch (SWE-bench's `test_patch`) and the
hidden test files; nothing of any agent's is in it. The test files — those given, those the patch writes
and, for tests already in the repository, the test modules beside the files the layer collects — are
read back from it, rewritten to trace every check (rewrite.py), and run twice, so a value that differs
between runs is never taken as expected. The graded rewrite is then collected there once, to pair its
parametrize ids with the task's, and run once on the reference solution: a test the worker would fail
there in its graded form is graded unblinded instead, so blinding never fails the reference. The key stays in this process (cached by the task's content and base
commit): the graded sandbox receives only `key.graded_files()`, written over the same paths.
"""

from __future__ import annotations

import io
import posixpath
import re
import tarfile

from environments.base import OpenSandbox, Sandbox
from environments.code_repo.blinding import Key, decide, plan_files, unblinded_key
from environments.code_repo.grader import (
    _pytest,
    _report,
    collect_test_ids,
    graded_spec,
    put_or_reject,
    run_reference,
)
from environments.code_repo.memo import TaskMemo
from environments.code_repo.repo import WORKSPACE, SetupError, apply_patch, install_repo, matches
from environments.code_repo.task import TEST_FILES, CodeRepoTask, TestSpec

REFERENCE_RUNS = 2
MAX_TEST_BYTES = 8 * 2**20
"""The test files read back from the reference sandbox, at most (a larger suite is graded unblinded)."""
_TEST_MODULES = [glob for glob in TEST_FILES if glob != "conftest.py"]
_keys: TaskMemo[Key] = TaskMemo()


def unblinded_reason(task: CodeRepoTask, *, enabled: bool) -> str:
    """Why the task's hidden tests are graded unblinded ('' when they can be blinded)."""
    if not isinstance(task.hidden_tests, TestSpec):
        return "a Harbor task's tests/test.sh is a program of its own: its checks cannot be judged outside"
    if not enabled:
        return "blinding is off for this environment (verifier.blind_hidden_tests)"
    if task.solution is None:
        return "the task has no reference solution"
    return ""


def reference_key(task: CodeRepoTask, *, base: str, open_sandbox: OpenSandbox) -> Key:
    """The task's key (cached); a canary's is the same key with every expected value perturbed, so its
    graded files are its task's byte for byte."""
    plain = task.model_copy(update={"canary": False})
    key = _keys.get_or_compute([plain.model_dump(mode="json"), base],
                               lambda: _compute(plain, base=base, open_sandbox=open_sandbox))
    return key.impossible() if task.canary else key


def _compute(task: CodeRepoTask, *, base: str, open_sandbox: OpenSandbox) -> Key:
    spec = task.hidden_tests
    solution = task.solution
    assert solution is not None and isinstance(spec, TestSpec)
    with open_sandbox() as trusted:
        if install_repo(trusted, task) != base:
            raise SetupError("the reference sandbox's base commit differs from the one the worker recorded")
        if solution.files:
            put_or_reject(trusted, {f"{WORKSPACE}/{path}": text.encode() for path, text in solution.files.items()})
        failure = apply_patch(trusted, solution.patch or "", name="reference solution") \
            or apply_patch(trusted, spec.patch or "", name="test patch")
        if failure:  # the task's defect, not the machine's: graded unblinded, and it says why
            return unblinded_key(failure)
        put_or_reject(trusted, {f"{WORKSPACE}/{path}": text.encode() for path, text in spec.files.items()})
        files = read_test_files(trusted, spec)
        if files is None:
            return unblinded_key(f"the test files are over {MAX_TEST_BYTES >> 20} MiB")
        plan = plan_files(files)
        tests = list(spec.tests) or collect_test_ids(trusted, spec) or []  # on the tests as given
        put_or_reject(trusted, {f"{WORKSPACE}/{path}": text.encode() for path, text in plan.reference.items()})
        runs = [run_reference(trusted, spec) for _ in range(REFERENCE_RUNS)]
        reference = [str(n) for n in (runs[0] or {}).get("collected") or []]
        refused: dict[str, str] = {}
        for _ in range(MAX_CHECKS):  # the reference solution must pass every blinded test in its graded form
            key = decide(plan, runs, tests, refused=refused)
            failing = _graded_failures(trusted, spec, key, reference)
            if not failing:
                break
            refused.update(failing)
        else:
            key = decide(plan, runs, tests, refused={test: GRADED_FAILS for test in tests})
            _graded_failures(trusted, spec, key, reference)
    return key


MAX_CHECKS = 3
GRADED_FAILS = "its graded form does not pass on the reference solution"


def _graded_failures(trusted: Sandbox, spec: TestSpec, key: Key, reference: list[str]) -> dict[str, str]:
    """Run the graded files on the reference solution, pair their ids with the reference's, and name the
    blinded tests the worker would fail there (a rewrite that changed what a test does: `exec` of a name
    the rewrite removed, ...)."""
    put_or_reject(trusted, {f"{WORKSPACE}/{path}": text.encode() for path, text in key.graded_files().items()})
    raw = _pytest(trusted, graded_spec(spec, key), extra=[])
    report = _report(raw.report) or {}
    key.map_ids(reference, [str(n) for n in report.get("collected") or []])
    return {test: f"{GRADED_FAILS} ({outcome}{': ' + why if why else ''})"[:300]
            for test, (outcome, why) in key.judge_report(report, key.expected).items() if outcome != "passed"}


def _test_dirs(spec: TestSpec) -> set[str]:
    """The directories whose test modules the layer's tests may live in (files named, collected or patched)."""
    paths = [*spec.files, *patched_files(spec.patch or ""), *spec.collect_paths()]
    dirs: set[str] = set()
    for path in paths:
        file_part = path.split("::", 1)[0].strip("/")
        if file_part in ("", "."):
            dirs.add(".")
        elif file_part.endswith(".py"):
            dirs.add(posixpath.dirname(file_part) or ".")
        else:
            dirs.add(file_part)
    return dirs


_READ = r"""
cd /workspace || exit 3
for dir in "$@"; do
  [ -d "$dir" ] || continue
  if [ "$dir" = . ]; then find . -maxdepth 1 -type f -name '*.py'; else find "$dir" -type f -name '*.py'; fi
done | sed 's|^\./||' | sort -u > /tmp/crucible-test-files
tar -c --no-recursion -T /tmp/crucible-test-files -f - 2>/dev/null | head -c $((MAX + 1))
"""


def read_test_files(sandbox: Sandbox, spec: TestSpec) -> dict[str, str] | None:
    """The test modules (not conftest.py) of the layer's directories as the reference sandbox holds them
    (after the test patch), as text; None when they are over MAX_TEST_BYTES."""
    script = _READ.replace("$((MAX + 1))", str(MAX_TEST_BYTES + 1))
    result = sandbox.exec(["bash", "-c", script, "read", *sorted(_test_dirs(spec))], as_keeper=True, timeout_s=120)
    data = bytes(result.output)
    if len(data) > MAX_TEST_BYTES:
        return None
    files: dict[str, str] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                path = member.name.removeprefix("./")
                if not member.isfile() or not matches(path, _TEST_MODULES) or path.endswith("conftest.py"):
                    continue
                handle = archive.extractfile(member)
                if handle is not None:
                    try:
                        files[path] = handle.read().decode()
                    except UnicodeDecodeError:
                        continue
    except tarfile.TarError:
        return files
    return files


def patched_files(patch: str) -> list[str]:
    """The files a unified diff writes (its `+++ b/PATH` lines)."""
    return [match[1] for match in re.finditer(r"^\+\+\+ b/(\S+)", patch, flags=re.MULTILINE)]
