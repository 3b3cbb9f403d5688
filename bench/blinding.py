"""How much of real test suites the grader judges outside the sandbox: the factory's nine packages' own
tests, through the platform's own blinding (environments/code_repo/reference.py) in real sandboxes.

    .venv/bin/python bench/blinding.py                       # the nine packages of recipes/factory.py
    .venv/bin/python bench/blinding.py --packages pypi:semver==3.0.2
    .venv/bin/python bench/blinding.py --mutants 2     # and 2 factory tasks a package, mutant and reference graded

Per package: the tests run once as the repository has them (the verdicts blinding must not change); the
tests that passed become a task whose reference solution is the original code; the trusted reference
sandbox traces them twice and makes the key (reference._compute, as the worker does); a fresh sandbox
receives only the graded files (no .git) and runs them; every test is judged outside with the key.
Prints one JSON object: per package and over all,
- `checks_outside`: checks reached by the reference run that are judged outside ÷ those plus the checks
  this grader does not rewrite;
- `tests_blinded_share`: tests judged outside check by check with no expected value left in the graded
  sandbox ÷ all tests (a blinded test whose expected value is also read elsewhere as an input does not
  count);
- `tests_no_expected_value_share`: the issue's measure, tests with no expected value in the graded sandbox
  ÷ all tests: the above plus the tests that have no check at all (nothing expected anywhere; they are
  graded on the process's report and named `no check was reached`);
- `verdict_changes`: tests whose verdict on the original code differs from the unmodified run's (must be 0);
- `remainder`: the tests not counted, by reason.
The factory's tasks grade these same tests (the kept ones) on the same files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from environments.base import OpenSandbox
from environments.code_repo import reference
from environments.code_repo.blinding import NO_CHECK, observations_of
from environments.code_repo.factory import FactoryOptions
from environments.code_repo.factory.pipeline import _layout, _read_tree, _snapshot, build_tasks
from environments.code_repo.factory.source import fetch, name_of
from environments.code_repo.grader import _pytest, _report, reference_run
from environments.code_repo.repo import WORKSPACE, forget_history, install_repo
from environments.code_repo.task import CodeRepoTask, Solution, TestSpec
from environments.images import build_images
from environments.sandboxes import DockerSandboxes, package_sandboxes
from environments.spec import EnvironmentSpec
from recipes.factory import PACKAGES
from sandboxes import InMemoryEventSink, make_backend

_CANARY = re.compile(r"(^|/)test_[0-9a-f]{12}\.py::test_[0-9a-f]{12}$")
"""The grader's own canary tests (random names) in a run's report."""


def _reason(text: str) -> str:
    return re.sub(r"^\S+:\d+: ", "", text)[:90]


def measure(source: str, *, open_sandbox: OpenSandbox, workdir: Path) -> dict[str, Any]:
    began = time.monotonic()
    files = _read_tree(fetch(source, into=workdir))
    layout = _layout(files)
    spec = TestSpec(paths=layout.test_files, pythonpath=layout.pythonpath, timeout_s=900)
    task = CodeRepoTask(repo=_snapshot(files), hidden_tests=spec)
    with open_sandbox() as sandbox:
        base = install_repo(sandbox, task)
        original, _ = reference_run(sandbox, spec)
    outcomes = {str(k): str(v) for k, v in ((original or {}).get("outcomes") or {}).items()}
    tests = sorted(t for t, o in outcomes.items() if o == "passed" and not _CANARY.search(t))
    task = task.model_copy(update={"hidden_tests": spec.model_copy(update={"tests": tests}), "solution": Solution()})
    key = reference._compute(task, base=base, open_sandbox=open_sandbox)
    graded = _graded_report(task, key, open_sandbox=open_sandbox, solved=False)
    changes = [t for t, (outcome, _) in key.judge_report(graded, tests).items() if outcome != "passed"]
    observed = {key.original(t): v for t, v in observations_of(graded).items()}
    reached = {e.site for sequence in key.expected.values() for e in sequence}
    reached |= {sid for t in key.unblinded for sid, _ in observed.get(t, [])}
    unsupported = sum(len(m.unsupported) for m in key.plan.modules.values())
    outside = len(reached & key.blind)
    remainder = Counter(_reason(why) for why in key.unblinded.values())
    remainder.update(_reason(why) for why in key.kept.values())
    blind_tests = len(key.expected) - len(key.kept)
    no_check = sum(1 for why in key.unblinded.values() if why == NO_CHECK)
    return {"tests": len(tests), "tests_blind": blind_tests, "tests_without_checks": no_check,
            "checks": len(reached) + unsupported,
            "checks_outside": outside, "tests_blinded_share": round(blind_tests / len(tests), 3) if tests else None,
            "checks_outside_share": round(outside / (len(reached) + unsupported), 3) if reached else None,
            "verdict_changes": len(changes), "changed": changes[:5], "unsupported_checks": unsupported,
            "remainder": dict(remainder.most_common()), "seconds": round(time.monotonic() - began, 1)}


def _graded_report(task: CodeRepoTask, key: Any, *, open_sandbox: OpenSandbox, solved: bool) -> dict[str, Any]:
    """A hidden-test run as the worker's makes it: the task's base (the mutant) or, `solved`, base + its
    reference; the graded files over the tests; no .git."""
    with open_sandbox() as sandbox:
        install_repo(sandbox, task)
        if solved and task.solution is not None:
            sandbox.put_files({f"{WORKSPACE}/{p}": t.encode() for p, t in task.solution.files.items()})
        sandbox.put_files({f"{WORKSPACE}/{path}": text.encode() for path, text in key.graded_files().items()})
        forget_history(sandbox)
        assert isinstance(task.hidden_tests, TestSpec)  # the factory's tasks: pytest layers
        raw = _pytest(sandbox, task.hidden_tests, extra=[])
    return _report(raw.report) or {}


def _judged_failures(task: CodeRepoTask, key: Any, *, open_sandbox: OpenSandbox, solved: bool) -> list[str]:
    """The tests the worker fails on the task's base (the mutant) or, `solved`, on base + its reference."""
    report = _graded_report(task, key, open_sandbox=open_sandbox, solved=solved)
    assert isinstance(task.hidden_tests, TestSpec)
    return sorted(t for t, (outcome, _) in key.judge_report(report, task.hidden_tests.tests).items()
                  if outcome != "passed")


def mutants(source: str, count: int, *, open_sandbox: OpenSandbox, package_sandbox: Any, workdir: Path) -> dict[str, Any]:
    """`count` factory tasks of the package, each graded blinded on its mutant and on its reference: the
    mutant must fail exactly its FAIL_TO_PASS tests, the reference none."""
    lines, report = build_tasks(source, open_sandbox=open_sandbox, workdir=workdir, package_sandbox=package_sandbox,
                                options=FactoryOptions(max_mutations=count * 3, jobs=1))
    checked, mismatches = 0, []
    for line in lines[:count]:
        task = CodeRepoTask.model_validate({k: line[k] for k in ("repo", "public_tests", "hidden_tests", "solution")
                                            if k in line} | ({"image": line["image"]} if line.get("image") else {}))
        with open_sandbox() as sandbox:
            base = install_repo(sandbox, task)
        key = reference._compute(task, base=base, open_sandbox=open_sandbox)
        failing = _judged_failures(task, key, open_sandbox=open_sandbox, solved=False)
        solved = _judged_failures(task, key, open_sandbox=open_sandbox, solved=True)
        checked += 1
        if failing != sorted(line["factory"]["fail_to_pass"]) or solved:
            mismatches.append({"task": line["id"], "fail_to_pass": line["factory"]["fail_to_pass"][:5],
                               "mutant_fails": failing[:5], "reference_fails": solved[:5]})
    return {"tasks": checked, "mismatches": mismatches, "factory_error": report.error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES))
    parser.add_argument("--mutants", type=int, default=0,
                        help="Also make this many factory tasks per package and check each blinded verdict: the "
                             "mutant fails exactly its FAIL_TO_PASS tests, the reference none (~1 minute a task).")
    args = parser.parse_args()
    tag = next(image.tag for image in build_images(names=["code-repo"]) if image.name == "code-repo")
    spec = EnvironmentSpec.model_validate({"name": "bench-blinding", "kind": "code_repo", "image": tag,
                                           "sandbox": {"memory": "1g", "pids": 512, "workspace_size": "256m"}})
    sandboxes = DockerSandboxes(backend=make_backend("docker"), events=InMemoryEventSink(), worker="bench-blinding",
                                min_size=0, max_size=2)
    per_package: dict[str, Any] = {}
    try:
        for source in args.packages:
            with tempfile.TemporaryDirectory(prefix="bench-blinding-") as directory:
                try:
                    per_package[name_of(source)] = measure(source, open_sandbox=sandboxes.pool_for(spec).open_fresh,
                                                           workdir=Path(directory))
                    if args.mutants:
                        per_package[name_of(source)]["mutants"] = mutants(
                            source, args.mutants, open_sandbox=sandboxes.pool_for(spec).open_fresh,
                            package_sandbox=package_sandboxes(sandboxes, spec), workdir=Path(directory) / "factory")
                except Exception as error:  # one package's failure is reported, the others still measured
                    per_package[name_of(source)] = {"error": f"{type(error).__name__}: {error}"[:300]}
                print(f"{name_of(source)}: {per_package[name_of(source)]}", file=sys.stderr)
    finally:
        sandboxes.close()
    done = [p for p in per_package.values() if "error" not in p]
    total = {k: sum(p[k] for p in done)
             for k in ("tests", "tests_blind", "tests_without_checks", "checks", "checks_outside", "verdict_changes")}
    clean = total["tests_blind"] + total["tests_without_checks"]
    checked = [p["mutants"] for p in done if "mutants" in p]
    print(json.dumps({
        "packages": len(per_package), "measured": len(done), **total,
        **({"mutant_tasks": sum(m["tasks"] for m in checked),
            "mutant_mismatches": sum(len(m["mismatches"]) for m in checked)} if checked else {}),
        "checks_outside_share": round(total["checks_outside"] / total["checks"], 3) if total["checks"] else None,
        "tests_blinded_share": round(total["tests_blind"] / total["tests"], 3) if total["tests"] else None,
        "tests_no_expected_value_share": round(clean / total["tests"], 3) if total["tests"] else None,
        "per_package": per_package,
    }))


if __name__ == "__main__":
    main()
