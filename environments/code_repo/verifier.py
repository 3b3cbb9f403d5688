"""The code_repo verifier, in layers, each logged on its own:

1. `rules`: the agent submitted a non-empty change that leaves the test files alone and shows none of
   the cheats the rules can spot. Failing it zeroes the later layers (they are not run).
2. `public_tests`: the public tests pass in the agent's own sandbox.
3. `hidden_tests`: the hidden tests pass in a FRESH sandbox holding the base repo plus the submitted
   diff — never where the agent worked, so it cannot tamper with its grader.

Reward = Σ weight(layer) × score(layer), weights from the environment spec.
"""

from __future__ import annotations

import re
import time

from environments.base import LayerResult, OpenSandbox, Sandbox, Verdict
from environments.code_repo.repo import WORKSPACE, apply_diff, install_repo, protected_changes, workspace_diff
from environments.code_repo.task import CodeRepoTask, TestSpec

DEFAULT_WEIGHTS = {"rules": 0.0, "public_tests": 0.0, "hidden_tests": 1.0}

# Added lines that short-circuit a test run rather than fix code.
CHEATS = [
    (re.compile(r"\bos\._exit\s*\("), "calls os._exit"),
    (re.compile(r"\bsys\.exit\s*\(\s*0?\s*\)"), "calls sys.exit"),
    (re.compile(r"\bpytest\.(skip|xfail)\s*\("), "skips tests"),
    (re.compile(r"@(pytest\.mark\.skip|unittest\.skip)"), "skips tests"),
    (re.compile(r"\bPYTEST_CURRENT_TEST\b"), "detects the test runner"),
]


def _added_lines(diff: str) -> list[str]:
    return [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def rules_layer(*, diff: str, submitted: bool, task: CodeRepoTask) -> LayerResult:
    problems = []
    if not submitted:
        problems.append("no submission")
    if not diff.strip():
        problems.append("empty change")
    touched = protected_changes(diff, task.protected_paths)
    if touched:
        problems.append(f"edits test files: {', '.join(touched)}")
    added = _added_lines(diff)
    problems += sorted({why for pattern, why in CHEATS if any(pattern.search(line) for line in added)})
    return LayerResult("rules", 0.0 if problems else 1.0, not problems, "; ".join(problems) or "ok")


def _run_tests(sandbox: Sandbox, spec: TestSpec, name: str) -> LayerResult:
    started = time.monotonic()
    step = sandbox.step(f"cd {WORKSPACE} && {spec.command}", timeout=spec.timeout_s)
    passed = step.exit_code == 0 and step.status in ("ok", "output_truncated")
    detail = f"exit {step.exit_code} ({step.status})\n{step.output[-2000:]}"
    return LayerResult(name, 1.0 if passed else 0.0, passed, detail, time.monotonic() - started)


def hidden_layer(*, diff: str, task: CodeRepoTask, open_sandbox: OpenSandbox) -> LayerResult:
    started = time.monotonic()
    spec = task.hidden_tests
    with open_sandbox() as fresh:
        install_repo(fresh, task)
        try:
            apply_diff(fresh, diff, name="submission")
        except RuntimeError as error:
            return LayerResult("hidden_tests", 0.0, False, f"the submitted diff does not apply: {error}",
                               time.monotonic() - started)
        if spec.patch:
            apply_diff(fresh, spec.patch, name="tests")
        if spec.files:
            fresh.put_files({f"{WORKSPACE}/{path}": content.encode() for path, content in spec.files.items()})
        result = _run_tests(fresh, spec, "hidden_tests")
    return LayerResult(result.name, result.score, result.passed, result.detail, time.monotonic() - started)


def verify(
    *, sandbox: Sandbox, task: CodeRepoTask, submitted: bool, open_sandbox: OpenSandbox,
    weights: dict[str, float],
) -> Verdict:
    diff = workspace_diff(sandbox)
    rules = rules_layer(diff=diff, submitted=submitted, task=task)
    layers = [rules]
    if rules.passed:
        if task.public_tests is not None:
            layers.append(_run_tests(sandbox, task.public_tests, "public_tests"))
        layers.append(hidden_layer(diff=diff, task=task, open_sandbox=open_sandbox))
    else:
        layers += [LayerResult(name, 0.0, False, "not run: the rules layer failed")
                   for name in ("public_tests", "hidden_tests") if name != "public_tests" or task.public_tests]
    weights = {**DEFAULT_WEIGHTS, **weights} if weights else DEFAULT_WEIGHTS
    reward = sum(weights.get(layer.name, 0.0) * layer.score for layer in layers)
    return Verdict(reward=reward, layers=layers, diff=diff)
