"""How much of real test suites the grader judges outside the sandbox: the factory's nine packages' own
tests, through the platform's own blinding (environments/code_repo/reference.py) in real sandboxes.

    .venv/bin/python bench/blinding.py                       # the nine packages of recipes/factory.py
    .venv/bin/python bench/blinding.py --packages pypi:semver==3.0.2

Per package: the tests run once as the repository has them (the verdicts blinding must not change); the
tests that passed become a task whose reference solution is the original code; the trusted reference
sandbox traces them twice and makes the key (reference._compute, as the worker does); a fresh sandbox
receives only the graded files (no .git) and runs them; every test is judged outside with the key.
Prints one JSON object: per package and over all,
- `checks_outside`: checks reached by the reference run that are judged outside ÷ those plus the checks
  this grader does not rewrite;
- `tests_blind`: tests with no expected value in the graded sandbox ÷ all tests (a blinded test whose
  expected value is also read elsewhere as an input does not count);
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
from environments.code_repo.blinding import observations_of
from environments.code_repo.factory.pipeline import _layout, _read_tree, _snapshot
from environments.code_repo.factory.source import fetch, name_of
from environments.code_repo.grader import _pytest, _report, reference_run
from environments.code_repo.repo import WORKSPACE, forget_history, install_repo
from environments.code_repo.task import CodeRepoTask, Solution, TestSpec
from environments.images import build_images
from environments.spec import EnvironmentSpec
from recipes.factory import PACKAGES
from sandboxes import InMemoryEventSink, make_backend
from task_workers.context import DockerSandboxes

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
    with open_sandbox() as sandbox:
        install_repo(sandbox, task)
        sandbox.put_files({f"{WORKSPACE}/{path}": text.encode() for path, text in key.graded_files().items()})
        forget_history(sandbox)
        raw = _pytest(sandbox, task.hidden_tests, extra=[])
    graded = _report(raw.report) or {}
    judged_outcomes = {key.original(str(t)): str(o) for t, o in (graded.get("outcomes") or {}).items()}
    observed = {key.original(t): v for t, v in observations_of(graded).items()}
    changes = [t for t in tests if key.judge(t, judged_outcomes.get(t, "not run"), observed.get(t, []))[0] != "passed"]
    reached = {sid for sequence in key.expected.values() for sid, *_ in [(e.site,) for e in sequence]}
    reached |= {sid for t in key.unblinded for sid, _ in observed.get(t, [])}
    unsupported = sum(len(m.unsupported) for m in key.plan.modules.values())
    outside = len(reached & key.blind)
    remainder = Counter(_reason(why) for why in key.unblinded.values())
    remainder.update(_reason(why) for why in key.kept.values())
    blind_tests = len(key.expected) - len(key.kept)
    return {"tests": len(tests), "tests_blind": blind_tests, "checks": len(reached) + unsupported,
            "checks_outside": outside, "tests_blinded_share": round(blind_tests / len(tests), 3) if tests else None,
            "checks_outside_share": round(outside / (len(reached) + unsupported), 3) if reached else None,
            "verdict_changes": len(changes), "changed": changes[:5], "unsupported_checks": unsupported,
            "remainder": dict(remainder.most_common()), "seconds": round(time.monotonic() - began, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES))
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
                except Exception as error:  # one package's failure is reported, the others still measured
                    per_package[name_of(source)] = {"error": f"{type(error).__name__}: {error}"[:300]}
                print(f"{name_of(source)}: {per_package[name_of(source)]}", file=sys.stderr)
    finally:
        sandboxes.close()
    done = [p for p in per_package.values() if "error" not in p]
    total = {k: sum(p[k] for p in done) for k in ("tests", "tests_blind", "checks", "checks_outside", "verdict_changes")}
    print(json.dumps({
        "packages": len(per_package), "measured": len(done), **total,
        "checks_outside_share": round(total["checks_outside"] / total["checks"], 3) if total["checks"] else None,
        "tests_blinded_share": round(total["tests_blind"] / total["tests"], 3) if total["tests"] else None,
        "per_package": per_package,
    }))


if __name__ == "__main__":
    main()
