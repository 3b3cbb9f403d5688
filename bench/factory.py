"""Task factory benchmark: prints ONE JSON object (not a test). Run: `.venv/bin/python bench/factory.py`.

    .venv/bin/python bench/factory.py                                  # recipes/factory.py's packages, 40 mutants each
    .venv/bin/python bench/factory.py --max-mutations 150 --packages pypi:toolz==1.0.0

`crucible tasks factory`'s pipeline (environments/code_repo/factory) over the packages, one after the
other, on this machine's dockerd with the `code-repo` image (a package with requirements on its own image,
built first and counted in the time): every mutant validated in a fresh sandbox,
two at a time. Counted, not computed: validated tasks, mutants tried and kept per operator (the yield
is kept / tried), rejections by reason; timed: the whole run's wall-clock (package downloads, baselines
and coverage runs included), whence validated tasks per minute. Nothing is compared, so there is no
paired ratio: it is one measurement of throughput on 2 cores, and of which operators make tasks.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments.code_repo.factory import FactoryOptions, run_factory
from environments.images import build_images
from environments.sandboxes import DockerSandboxes, package_sandboxes
from environments.spec import EnvironmentSpec
from recipes.factory import PACKAGES
from sandboxes import InMemoryEventSink, make_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES))
    parser.add_argument("--max-mutations", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tag = next(image.tag for image in build_images(names=["code-repo"]) if image.name == "code-repo")
    spec = EnvironmentSpec.model_validate({"name": "bench-factory", "kind": "code_repo", "image": tag})
    sandboxes = DockerSandboxes(backend=make_backend("docker"), events=InMemoryEventSink(), worker="bench-factory",
                                min_size=0, max_size=args.jobs + 1)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-factory-") as directory:
            report = run_factory(args.packages, open_sandbox=sandboxes.pool_for(spec).open_fresh,
                                 out=Path(directory) / "tasks.jsonl", package_sandbox=package_sandboxes(sandboxes, spec),
                                 options=FactoryOptions(max_mutations=args.max_mutations, seed=args.seed, jobs=args.jobs))
    finally:
        sandboxes.close()
    tried: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    for package in report.packages:
        tried.update(package.tried)
        kept.update(package.kept)
        rejected.update(package.rejected)
    print(json.dumps({
        "packages": len(args.packages), "max_mutations_per_package": args.max_mutations, "jobs": args.jobs,
        "tasks": report.tasks, "minutes": round(report.minutes, 1), "tasks_per_minute": report.tasks_per_minute,
        "tried": sum(tried.values()),
        "yield_per_operator": {op: {"tried": tried[op], "kept": kept[op], "yield": round(kept[op] / tried[op], 2)}
                               for op in sorted(tried)},
        "rejected": dict(rejected.most_common()),
        "per_package": {p.package: {"tasks": p.tasks, "tests_kept": p.tests_kept, "error": p.error}
                        for p in report.packages},
    }))


if __name__ == "__main__":
    main()
