"""The task factory: Python packages with tests become verifiable code_repo repair tasks.

    crucible tasks factory pypi:toolz==1.0.0 ./mylib --env factory --out tasks.jsonl

source.py fetches and cleans a package; mutations.py breaks one function at a time; pipeline.py keeps
the mutants that some of the package's own tests catch, and writes each as a task (docs/environments/
task-factory.md).
"""

from environments.code_repo.factory.mutations import OPERATORS, Mutation, mutations
from environments.code_repo.factory.pipeline import (
    FactoryOptions,
    FactoryReport,
    PackageReport,
    build_tasks,
    run_factory,
)

__all__ = ["OPERATORS", "FactoryOptions", "FactoryReport", "Mutation", "PackageReport", "build_tasks", "mutations",
           "run_factory"]
