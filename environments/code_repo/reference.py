"""The trusted side of blinded grading: the hidden tests run on the task's reference solution.

    why = unblinded_reason(task, enabled=config.blind_hidden_tests)   # "" when the task can be blinded
    key = reference_key(task, base=base, open_sandbox=open_sandbox)  # blinding.Key, cached per task

A fresh sandbox holds the base, the reference solution and the hidden tests instrumented to record every
operand of every blindable assert; nothing of any agent's is in it. The tests run twice there, so a value
that differs between runs is never taken as expected. The resulting key stays in this process (cached by
the task's content and base commit): the graded sandbox receives only `key.graded_files()`.
"""

from __future__ import annotations

from environments.base import OpenSandbox
from environments.code_repo.blinding import Key, decide, plan_files
from environments.code_repo.grader import collect_test_ids, put_or_reject, run_reference
from environments.code_repo.memo import TaskMemo
from environments.code_repo.repo import WORKSPACE, SetupError, apply_patch, install_repo
from environments.code_repo.task import CodeRepoTask

REFERENCE_RUNS = 2
_keys: TaskMemo[Key] = TaskMemo()


def unblinded_reason(task: CodeRepoTask, *, enabled: bool) -> str:
    """Why the task's hidden tests are graded unblinded ('' when they can be blinded)."""
    spec = task.hidden_tests
    if not enabled:
        return "blinding is off for this environment (verifier.blind_hidden_tests)"
    if task.solution is None:
        return "the task has no reference solution"
    if not any(path.endswith(".py") for path in spec.files):
        return "the hidden tests are not given as files (a test patch or tests already in the repository)"
    return ""


def reference_key(task: CodeRepoTask, *, base: str, open_sandbox: OpenSandbox) -> Key:
    return _keys.get_or_compute([task.model_dump(mode="json"), base],
                                lambda: _compute(task, base=base, open_sandbox=open_sandbox))


def _compute(task: CodeRepoTask, *, base: str, open_sandbox: OpenSandbox) -> Key:
    spec = task.hidden_tests
    solution = task.solution
    assert solution is not None
    plan = plan_files(spec.files)
    with open_sandbox() as trusted:
        if install_repo(trusted, task) != base:
            raise SetupError("the reference sandbox's base commit differs from the one the worker recorded")
        if solution.files:
            put_or_reject(trusted, {f"{WORKSPACE}/{path}": text.encode() for path, text in solution.files.items()})
        failure = apply_patch(trusted, solution.patch or "", name="reference solution")
        if failure:  # the task's defect, not the machine's: graded unblinded, and it says why
            return Key(plan=plan, expected={}, blind=frozenset(), unblinded={}, reason=failure)
        put_or_reject(trusted, {f"{WORKSPACE}/{path}": text.encode() for path, text in plan.reference_files().items()})
        tests = list(spec.tests) or collect_test_ids(trusted, spec) or []
        runs = [run_reference(trusted, spec) for _ in range(REFERENCE_RUNS)]
    return decide(plan, runs, tests)
