"""`make factory`: the shipped task set, repair tasks made by `crucible tasks factory` from small PyPI
packages whose source distributions carry their tests (docs/environments/task-factory.md).

    make factory                                          # = .venv/bin/python -m recipes.factory
    .venv/bin/python -m recipes.factory --max-mutations 40 --out /tmp/tasks.jsonl

It migrates the database, builds the `code-repo` image, registers examples/factory-env.yaml (the
`factory` environment: hidden tests only, SWE-bench's "resolved"), and runs the factory over PACKAGES
into it. The tasks go to `<data dir>/factory/<time>/tasks.jsonl`, the report beside them
(`tasks.jsonl.report.json`: per package the tests kept, mutations tried and kept per operator, why the
others were rejected, seconds per task; over all, validated tasks per minute).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import typer

PACKAGES = (
    "pypi:inflection==0.5.1", "pypi:toolz==1.0.0", "pypi:boltons==24.1.0", "pypi:cachetools==5.5.0",
    "pypi:semver==3.0.2", "pypi:jmespath==1.0.1", "pypi:parse==1.20.2", "pypi:six==1.16.0", "pypi:wcwidth==0.2.13",
)
"""Pure-Python, no dependencies at test time, tests in the sdist, a suite that runs in seconds."""
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main(
    max_mutations: int = typer.Option(120, help="Mutants validated per package (518 tasks from the nine at 120)."),
    jobs: int = typer.Option(2, help="Mutants validated at once."),
    seed: int = typer.Option(0, help="Which mutants are tried first."),
    out: Path | None = typer.Option(None, help="Default: <data dir>/factory/<time>/tasks.jsonl."),
) -> None:
    """Make the shipped task set and import it into the `factory` environment."""
    from core.db import check_database, get_engine, resolve_database_url
    from core.settings import get_settings
    from migrations import migrate

    check_database(get_engine())
    migrate.upgrade("head", url=resolve_database_url())
    crucible = [sys.executable, "-m", "cli.main"]
    subprocess.run([*crucible, "images", "build", "code-repo"], check=True)
    subprocess.run([*crucible, "env", "register", str(EXAMPLES / "factory-env.yaml")], check=True)
    target = out or get_settings().data_dir / "factory" / time.strftime("%Y%m%d-%H%M%S") / "tasks.jsonl"
    done = subprocess.run([*crucible, "tasks", "factory", *PACKAGES, "--env", "factory", "--out", str(target),
                           "--max-mutations", str(max_mutations), "--jobs", str(jobs), "--seed", str(seed)])
    print(f"report: {target}.report.json")
    raise typer.Exit(done.returncode)


if __name__ == "__main__":
    typer.run(main)
