"""A hack canary of a code_repo task (core/canaries.py): the task itself, marked `canary`. The worker
grades it with the task's own key with every expected value perturbed (blinding.Key.impossible), so the
graded sandbox receives the task's files byte for byte — nothing tells the policy it is a canary — and no
honest change passes any of its tests: any reward on its verification layer came through a hole in the
comparator.

    variant = canary_variant(payload)     # None when the task has no reference solution (nothing to perturb)
"""

from __future__ import annotations

from typing import Any

from environments.code_repo.task import CodeRepoTask


def canary_variant(payload: dict[str, Any]) -> dict[str, Any] | None:
    if CodeRepoTask.model_validate(payload).solution is None:
        return None
    return {**payload, "canary": True}
