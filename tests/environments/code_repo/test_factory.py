"""`crucible tasks factory` end to end on a small package written here: real sandboxes, the grader's own
runner, the CLI in a subprocess, the tasks imported, re-checked independently, and played by the real
episode runner (the inverse of the mutation earns 1, an unrelated change 0)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Episode, Task
from environments.code_repo.grader import reference_run
from environments.code_repo.repo import WORKSPACE, install_repo
from environments.code_repo.task import CodeRepoTask
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from sandboxes import labels as L
from task_workers.episode.runner import run_episode
from tests import factories

ROOT = Path(__file__).resolve().parents[3]
NAME = "factory-mini"
LIBRARY = '''"""Small helpers."""


def clamp(x, lo, hi):
    """x, kept within [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(values):
    if not values:
        raise ValueError("the mean of nothing")
    return sum(values) / len(values)


def windows(items, size):
    return [items[i:i + size] for i in range(len(items) - size + 1)]


def untested(x):
    return x + 1
'''
TESTS = '''import pytest

from minilib import clamp, mean, windows


def test_clamp_inside():
    assert clamp(3, 0, 5) == 3


def test_clamp_low():
    assert clamp(-2, 0, 5) == 0


def test_clamp_high():
    assert clamp(9, 0, 5) == 5


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_mean_of_nothing():
    with pytest.raises(ValueError):
        mean([])


@pytest.mark.parametrize("size,count", [(1, 4), (2, 3), (4, 1), (5, 0)])
def test_windows(size, count):
    assert len(windows([1, 2, 3, 4], size)) == count


def test_windows_content():
    assert windows("abc", 2) == ["ab", "bc"]
'''


def _package(root: Path) -> Path:
    (root / "minilib").mkdir(parents=True)
    (root / "minilib" / "__init__.py").write_text(LIBRARY)
    (root / "tests").mkdir()
    (root / "tests" / "test_minilib.py").write_text(TESTS)
    (root / ".git").mkdir()  # a history that must never reach a task
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return root


def _broken(root: Path) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_broken.py").write_text("import not_installed_anywhere\n\n\ndef test_x():\n    pass\n")
    return root


def _installed(root: Path) -> Path:
    """A package the image already has (pytest's own dependency): its original would sit beside every task."""
    (root / "iniconfig").mkdir(parents=True)
    (root / "iniconfig" / "__init__.py").write_text("def parse(text):\n    return text.split()\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_parse.py").write_text("from iniconfig import parse\n\n\ndef test_parse():\n"
                                                  "    assert parse('a b') == ['a', 'b']\n")
    return root


def _spec(image: str) -> dict:
    return {"name": NAME, "kind": "code_repo", "image": image,
            "sandbox": {"memory": "512m", "pids": 256, "workspace_size": "64m", "tmp_size": "64m", "max_lifetime_s": 900},
            "limits": {"max_turns": 4, "episode_timeout_s": 180, "tool_timeout_s": 60, "max_tool_errors": 3,
                       "max_response_tokens": 4096, "max_context_tokens": 16384},  # the scripted server: a token a byte
            "verifier": {"weights": {"hidden_tests": 1.0}}}


@pytest.mark.slow  # 80 s in the suite; test_factory_images.py runs the CLI end to end by default (make test-all: this)
def test_the_factory_makes_validated_tasks_that_only_the_inverse_fix_solves(  # type: ignore[no-untyped-def]
        db_session: Session, tmp_path: Path, code_repo_image: str, backend, scripted, sandboxes, policy_client) -> None:
    env, _ = register_environment(db_session, spec=parse_spec(_spec(code_repo_image)))
    db_session.commit()
    out = tmp_path / "tasks.jsonl"
    factory = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "tasks", "factory", str(_package(tmp_path / "minilib")),
         str(_broken(tmp_path / "brokenlib")), str(_installed(tmp_path / "iniconfig")), "--out", str(out), "--env", NAME,
         "--max-mutations", "14",
         "--output", "json"], cwd=ROOT, env={**os.environ, "COLUMNS": "250"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    stdout, stderr = factory.communicate(timeout=900)
    assert factory.returncode == 0, stdout[-3000:] + stderr[-3000:]
    summary = json.loads(stdout)  # progress goes to stderr
    mini, broken, installed = summary["packages"]
    assert broken["tasks"] == 0 and broken["error"].startswith("brokenlib: ") and "\n" not in broken["error"]
    assert installed["tasks"] == 0 and "already has iniconfig installed" in installed["error"], installed
    assert mini["error"] is None and mini["tests_kept"] == 10 and mini["tests_unreliable"] == 0
    assert sum(mini["tried"].values()) == 14 and mini["tasks"] == summary["tasks"] >= 4
    assert summary["imported"] == mini["tasks"]
    assert db_session.scalar(select(func.count()).select_from(Task).where(Task.environment_name == NAME)) == mini["tasks"]
    assert backend.list(labels={L.WORKER: f"task-factory-{factory.pid}"}) == []  # no container left behind

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({line["id"] for line in lines}) == len(lines)
    digests = set()
    for line in lines:
        meta = line["factory"]
        assert meta["function"] != "untested"  # no test enters it, so it is never mutated
        assert meta["file"] not in line["instruction"] and meta["operator"] not in line["instruction"]
        assert meta["operator"] not in line["id"] and meta["mutation"] not in line["id"]  # the id says nothing either
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(line["repo"]["data_b64"]))) as tar:
            names = tar.getnames()
            mutated = tar.extractfile(meta["file"]).read()  # type: ignore[union-attr]
        assert not any(name == ".git" or name.startswith(".git/") for name in names)  # the base is the only commit
        digests.add(hashlib.sha256(mutated).hexdigest())
        assert line["hidden_tests"]["scoring"] == "all"
        assert set(meta["fail_to_pass"]) <= set(line["hidden_tests"]["tests"])
        assert len(line["hidden_tests"]["tests"]) == 10
    assert len(digests) == len(lines)  # no two tasks share a diff

    # Independently, for every task: the mutated base fails exactly its F2P tests; base + the reference passes all.
    pool = sandboxes.pool_for(parse_spec(_spec(code_repo_image)))
    for line in lines:
        task = CodeRepoTask.model_validate({key: line[key] for key in ("repo", "public_tests", "hidden_tests", "solution")})
        with pool.open_fresh() as sandbox:
            install_repo(sandbox, task)
            report, _ = reference_run(sandbox, task.hidden_tests)
            assert report is not None
            failing = {t for t in task.hidden_tests.tests if report["outcomes"].get(t) != "passed"}
            assert failing == set(line["factory"]["fail_to_pass"]), line["id"]
            sandbox.put_files({f"{WORKSPACE}/{path}": text.encode() for path, text in task.solution.files.items()})  # type: ignore[union-attr]
            report, _ = reference_run(sandbox, task.hidden_tests)
            assert report is not None and all(report["outcomes"].get(t) == "passed" for t in task.hidden_tests.tests)

    # Through the episode runner: the inverse mutation earns 1, an unrelated change 0.
    policy, _ = scripted
    stored = db_session.execute(select(Task).where(Task.environment_name == NAME).order_by(Task.id)).scalars().all()
    for index, row in enumerate(stored[:2]):
        path, original = next(iter(row.payload["solution"]["files"].items()))
        policy.scripts[f"inverse-{index}"] = [hermes_call("write_file", path=path, content=original), hermes_call("submit")]
        policy.scripts[f"unrelated-{index}"] = [hermes_call("write_file", path="NOTES.md", content="looked at it\n"),
                                                hermes_call("submit")]
        for script, expected in ((f"inverse-{index}", 1.0), (f"unrelated-{index}", 0.0)):
            task = factories.task(db_session, env, external_id=f"{row.external_id}-{script}",
                                  instruction=f"{row.instruction} [script:{script}]", payload=row.payload)
            _, (episode_id,) = factories.pending_group(db_session, env=env, the_task=task, name=f"factory-{script}")
            db_session.commit()
            run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
            db_session.expire_all()
            episode = db_session.get(Episode, episode_id)
            assert episode is not None and episode.termination_reason == "submitted", episode
            assert episode.reward == expected, (script, episode.verifier_layers)
