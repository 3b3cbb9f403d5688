"""The factory's shipped set (`make factory`, recipes/factory.py), re-checked by code that is not the
factory's: a random sample of 50 tasks, each task's FAIL_TO_PASS tests failing on its base and passing
with the reference solution, every PASS_TO_PASS test passing on both; no repository holding a commit
or a `.git`; no two tasks sharing a diff. Then a real Celery worker plays the sample: the inverse of each
mutation (an edit_file a policy could write) earns 1, an unrelated change 0; and the red team's hacks,
played by the episode runner on a factory task on top of the unrelated change, earn no more than it.

The set is CRUCIBLE_FACTORY_TASKS (a tasks.jsonl `make factory` wrote) when given; otherwise the recipe's
packages at a small budget, made here by the CLI. Marked slow (minutes): `make test-all` runs it.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from environments.code_repo.grader import reference_run
from environments.code_repo.repo import WORKSPACE, install_repo
from environments.code_repo.task import CodeRepoTask
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from recipes.factory import PACKAGES
from task_workers.episode.runner import run_episode
from tests import factories
from tests.environments.code_repo.test_red_team import HACKS, UNFLAGGED_HACKS
from tests.support.episode_fixtures import wait_ended

# The Celery worker's reaper sweeps every crucible container on the machine: test_celery's group.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group("docker-global")]

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = 50
NAME = "factory-set"


def _spec(image: str) -> dict[str, Any]:
    return {"name": NAME, "kind": "code_repo", "image": image, "task_images": ["crucible-factory/*"],
            "sandbox": {"memory": "512m", "pids": 256, "workspace_size": "64m", "tmp_size": "64m", "max_lifetime_s": 1800},
            "limits": {"max_turns": 12, "episode_timeout_s": 600, "tool_timeout_s": 120, "max_tool_errors": 5,
                       "max_response_tokens": 4096, "max_context_tokens": 16384},  # the scripted server: a token a byte
            "verifier": {"weights": {"hidden_tests": 1.0}}}


@pytest.fixture(scope="module")
def every_line(tmp_path_factory: pytest.TempPathFactory, code_repo_image: str) -> list[dict[str, Any]]:
    given = os.environ.get("CRUCIBLE_FACTORY_TASKS")
    if given:
        path = Path(given)
    else:
        path = tmp_path_factory.mktemp("factory") / "tasks.jsonl"
        done = subprocess.run([sys.executable, "-m", "cli.main", "tasks", "factory", *PACKAGES, "--out", str(path),
                               "--max-mutations", "15"], cwd=ROOT, capture_output=True, text=True, timeout=3600)
        assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def sample(every_line: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert len(every_line) >= SAMPLE, len(every_line)
    return random.Random(0).sample(every_line, SAMPLE)


def _files(line: dict[str, Any]) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(line["repo"]["data_b64"]))) as tar:
        return {member.name: tar.extractfile(member).read()  # type: ignore[union-attr]
                for member in tar if member.isfile()}


def _task(line: dict[str, Any]) -> CodeRepoTask:
    keys = ("repo", "public_tests", "hidden_tests", "solution", "image")  # image: a package's own (it has requirements)
    return CodeRepoTask.model_validate({key: line[key] for key in keys if key in line})


def test_no_task_holds_history_and_no_two_share_a_diff(every_line: list[dict[str, Any]]) -> None:
    diffs = set()
    for line in every_line:
        files = _files(line)
        assert not any(name == ".git" or name.startswith(".git/") or "/.git/" in name for name in files), line["id"]
        path, original = next(iter(line["solution"]["files"].items()))
        diffs.add(hashlib.sha256(path.encode() + b"\0" + files[path]).hexdigest())
        assert files[path].decode() != original
    assert len(diffs) == len(every_line)
    assert len({line["id"] for line in every_line}) == len(every_line)


def test_each_sampled_task_fails_exactly_its_f2p_on_the_base_and_passes_everything_with_the_solution(  # type: ignore[no-untyped-def]
        sample: list[dict[str, Any]], sandboxes, code_repo_image: str) -> None:
    spec = parse_spec(_spec(code_repo_image))
    for line in sample:
        task = _task(line)
        f2p = set(line["factory"]["fail_to_pass"])
        on = spec.for_task(task)  # the environment's image, or the package's own
        with sandboxes.fresh(spec=on, run_id=None, episode_id=None) as sandbox:
            install_repo(sandbox, task)
            report, _ = reference_run(sandbox, task.hidden_tests)
            assert report is not None, line["id"]
            failing = {t for t in task.hidden_tests.tests if report["outcomes"].get(t) != "passed"}
            assert failing == f2p, line["id"]
        with sandboxes.fresh(spec=on, run_id=None, episode_id=None) as sandbox:  # nothing of the first run carries over
            install_repo(sandbox, task)
            sandbox.put_files({f"{WORKSPACE}/{p}": text.encode() for p, text in task.solution.files.items()})  # type: ignore[union-attr]
            report, _ = reference_run(sandbox, task.hidden_tests)
            assert report is not None, line["id"]
            assert [t for t in task.hidden_tests.tests if report["outcomes"].get(t) != "passed"] == [], line["id"]


def inverse_edit(path: str, mutated: str, original: str) -> str:
    """The edit_file call a policy would write to undo the mutation: the changed lines, widened by whole
    lines until the old text occurs once in the file."""
    before, after = mutated.splitlines(keepends=True), original.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes() if op[0] != "equal"]
    i1, i2, j1, j2 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
    while True:
        old, new = "".join(before[i1:i2]), "".join(after[j1:j2])
        if old and mutated.count(old) == 1:
            return hermes_call("edit_file", path=path, old_str=old, new_str=new)
        i1, j1 = max(0, i1 - 1), max(0, j1 - 1) if i1 > 0 else j1
        i2, j2 = min(len(before), i2 + 1), min(len(after), j2 + 1) if i2 < len(before) else j2


UNRELATED = hermes_call("write_file", path="NOTES.md", content="I looked into it.\n")
SUBMIT = hermes_call("submit")


def _pending(session: Session, env: Any, line: dict[str, Any], script: str, actions: list[str], policy: Any) -> int:
    """A pending episode of `line`'s task whose policy plays `actions` (the scripted server's `script`)."""
    policy.scripts[script] = actions
    task = factories.task(session, env, external_id=f"{line['id']}-{script}",
                          instruction=f"{line['instruction']} [script:{script}]",
                          payload=_task(line).model_dump(mode="json"))
    _, (episode_id,) = factories.pending_group(session, env=env, the_task=task, name=f"set-{script}")
    session.commit()
    return episode_id


def _play(session: Session, env: Any, line: dict[str, Any], script: str, actions: list[str], policy: Any,
          sandboxes: Any, client: Any) -> tuple[float, Any]:
    from core.models import Episode

    episode_id = _pending(session, env, line, script, actions, policy)
    run_episode(episode_id, policy=client, sandboxes=sandboxes, worker="test")
    session.expire_all()
    episode = session.get(Episode, episode_id)
    assert episode is not None and (episode.status, episode.failures) == ("completed", []), script
    assert episode.reward is not None, script
    return float(episode.reward), (line["id"], episode.termination_reason, episode.verifier_layers)


def test_the_inverse_fix_earns_1_and_an_unrelated_change_0_through_the_worker(  # type: ignore[no-untyped-def]
        sample: list[dict[str, Any]], db_session: Session, code_repo_image: str, scripted, celery_worker) -> None:
    """Through a real Celery worker (the task the controller dispatches, on the code_repo queue)."""
    env, _ = register_environment(db_session, spec=parse_spec(_spec(code_repo_image)))
    policy, _ = scripted
    expected: dict[int, tuple[float, str]] = {}
    for index, line in enumerate(sample):
        path, original = next(iter(line["solution"]["files"].items()))
        fix = inverse_edit(path, _files(line)[path].decode(), original)
        for script, actions, reward in ((f"inverse-{index}", [fix, SUBMIT], 1.0),
                                        (f"unrelated-{index}", [UNRELATED, SUBMIT], 0.0)):
            episode_id = _pending(db_session, env, line, script, actions, policy)
            celery_worker.send_task("crucible.run_episode", args=[episode_id], queue="code_repo")
            expected[episode_id] = (reward, script)
    for episode_id, (reward, script) in expected.items():
        episode = wait_ended(db_session, episode_id, timeout=1800)
        assert (episode.status, episode.failures) == ("completed", []), (script, episode.failures)
        assert episode.reward == reward, (script, episode.verifier_layers)


def _on_factory_task(actions: list[str], *, library: str, test_file: str) -> list[str]:
    """A red-team script aimed at calc.py and tests/test_calc.py, aimed at this task's files instead."""
    return [action.replace("tests/test_calc.py", test_file).replace("calc.py", library) for action in actions]


@pytest.mark.parametrize("name", [*HACKS, *UNFLAGGED_HACKS])
def test_the_red_teams_hacks_earn_no_more_than_the_unrelated_change_on_a_factory_task(  # type: ignore[no-untyped-def]
        name: str, sample: list[dict[str, Any]], db_session: Session, code_repo_image: str, scripted, sandboxes,
        policy_client) -> None:
    env, _ = register_environment(db_session, spec=parse_spec(_spec(code_repo_image)))
    policy, _ = scripted
    line = sample[0]
    library = line["factory"]["file"]
    test_file = line["factory"]["fail_to_pass"][0].split("::", 1)[0]
    actions = HACKS[name][0] if name in HACKS else UNFLAGGED_HACKS[name]
    script = "hack-" + hashlib.sha256(name.encode()).hexdigest()[:10]
    reward, why = _play(db_session, env, line, script, [*_on_factory_task(actions, library=library, test_file=test_file),
                                                        UNRELATED, SUBMIT], policy, sandboxes, policy_client)
    assert reward == 0.0, (name, why)
