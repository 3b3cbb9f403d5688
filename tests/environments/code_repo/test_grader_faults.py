"""The grader's own faults are faults (issue 22, item 7): a tree the worker packed that a fresh sandbox
fails to take is a GraderFault (retried), while a tree that does not fit is the agent's outcome."""

from __future__ import annotations

import pytest

from environments.code_repo.repo import (
    SetupError,
    SubmissionError,
    install_repo,
    load_submission,
    read_workspace,
)
from environments.code_repo.task import CodeRepoTask
from environments.spec import parse_spec

pytestmark = pytest.mark.docker


def _spec(image: str) -> object:
    return parse_spec({"name": "faults", "kind": "code_repo", "image": image,
                       "sandbox": {"memory": "512m", "pids": 256, "workspace_size": "16m", "tmp_size": "64m"}})


def test_a_fresh_sandbox_that_cannot_clear_its_checkout_is_a_grader_fault(sandboxes, code_repo_image,
                                                                          calc_task_payload) -> None:
    task = CodeRepoTask.model_validate(calc_task_payload)
    spec = _spec(code_repo_image)
    with sandboxes.fresh(spec=spec, run_id=1, episode_id=1) as agent, sandboxes.fresh(spec=spec, run_id=1,
                                                                                      episode_id=2) as grader:
        base = install_repo(agent, task)
        tree = read_workspace(agent)
        assert install_repo(grader, task) == base
        # Something of the grader's side that the checkout's removal cannot take away.
        grader.exec(["sh", "-c", "mkdir -p /workspace/held/inner && chmod 000 /workspace/held"])
        with pytest.raises(SetupError, match="step 4"):
            load_submission(grader, tree, base=base)


def test_a_tree_that_does_not_fit_is_the_agents_outcome(sandboxes, code_repo_image, calc_task_payload) -> None:
    task = CodeRepoTask.model_validate(calc_task_payload)
    spec = _spec(code_repo_image)
    with sandboxes.fresh(spec=spec, run_id=1, episode_id=3) as agent, sandboxes.fresh(spec=spec, run_id=1,
                                                                                      episode_id=4) as grader:
        base = install_repo(agent, task)
        agent.exec(["sh", "-c", "head -c 12582912 /dev/urandom > /workspace/blob.bin"])
        tree = read_workspace(agent)
        install_repo(grader, task)
        grader.exec(["sh", "-c", "head -c 6291456 /dev/urandom > /workspace/.git/ballast"])  # the grader's .git grew
        with pytest.raises(SubmissionError, match="does not fit"):
            load_submission(grader, tree, base=base)
