"""`crucible tasks factory` on a package whose tests need a dependency from the package index: it gets its own
image (the environment's plus that wheel), its tasks name it, and they are played and graded on it.

The dependency (wcwidth 0.2.13, one pure-Python wheel) comes from the package index pip is configured with,
as on every machine here; nothing is installed in the sandboxes at run time (they have no network)."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode, Task
from environments.code_repo.factory import FactoryOptions, build_tasks
from environments.images.packages import package_image
from environments.parsing import hermes_call
from environments.sandboxes import DockerSandboxes
from environments.service import register_environment
from environments.spec import parse_spec
from sandboxes import InMemoryEventSink
from sandboxes import labels as L
from sandboxes.docker_client import docker_api
from sandboxes.events import EventKind
from task_workers.episode.runner import run_episode
from tests import factories
from tests.environments.code_repo.test_factory import _broken, _installed, _spec

ROOT = Path(__file__).resolve().parents[3]
NAME = "factory-deps"
LIBRARY = '''"""Text that lines up in a terminal."""

from wcwidth import wcswidth


def pad(text, width):
    """`text` padded with spaces to `width` terminal cells."""
    missing = width - wcswidth(text)
    if missing <= 0:
        return text
    return text + " " * missing


def widest(texts):
    best = 0
    for text in texts:
        if wcswidth(text) > best:
            best = wcswidth(text)
    return best
'''
TESTS = '''from widthlib import pad, widest


def test_pad_ascii():
    assert pad("ab", 4) == "ab  "


def test_pad_wide():
    assert pad("\\u4e2d", 4) == "\\u4e2d  "


def test_pad_full():
    assert pad("abcd", 2) == "abcd"


def test_widest():
    assert widest(["a", "\\u4e2d\\u6587", "abc"]) == 4


def test_widest_empty():
    assert widest([]) == 0
'''


def _package(root: Path) -> Path:
    (root / "widthlib").mkdir(parents=True)
    (root / "widthlib" / "__init__.py").write_text(LIBRARY)
    (root / "tests").mkdir()
    (root / "tests" / "test_widthlib.py").write_text(TESTS)
    (root / "pyproject.toml").write_text('[project]\nname = "widthlib"\nversion = "1.0"\n'
                                         'dependencies = ["wcwidth==0.2.13"]\n')
    (root / ".git").mkdir()  # a history that must never reach a task
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return root


def test_a_package_with_a_dependency_gets_its_own_image_and_its_tasks_are_graded_on_it(  # type: ignore[no-untyped-def]
        db_session: Session, tmp_path: Path, code_repo_image: str, backend, scripted, policy_client) -> None:
    env, _ = register_environment(db_session, spec=parse_spec({**_spec(code_repo_image), "name": NAME,
                                                               "task_images": ["crucible-factory/*"]}))
    db_session.commit()
    out = tmp_path / "tasks.jsonl"
    factory = subprocess.run(
        [sys.executable, "-m", "cli.main", "tasks", "factory", str(_package(tmp_path / "widthlib")),
         str(_broken(tmp_path / "brokenlib")), str(_installed(tmp_path / "iniconfig")), "--out", str(out),
         "--env", NAME, "--max-mutations", "4", "--output", "json"],
        cwd=ROOT, env={**os.environ, "COLUMNS": "250"}, capture_output=True, text=True, timeout=900)
    assert factory.returncode == 0, factory.stdout[-3000:] + factory.stderr[-3000:]
    report, broken, installed = json.loads(factory.stdout)["packages"]
    # A package's fault is its one line, and the others go on (test_factory.py's whole run is marked slow).
    assert broken["tasks"] == 0 and broken["error"].startswith("brokenlib: ") and "\n" not in broken["error"]
    assert installed["tasks"] == 0 and "already has iniconfig installed" in installed["error"], installed
    assert report["error"] is None and report["requirements"] == ["wcwidth==0.2.13"], report
    image = report["image"]
    assert image.startswith("crucible-factory/widthlib:") and report["tests_kept"] == 5 and report["tasks"] >= 1
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["image"] for line in lines} == {image}
    for line in lines:  # the package's .git never reaches a task, and no two tasks share a diff
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(line["repo"]["data_b64"]))) as tar:
            assert not any(name == ".git" or name.startswith(".git/") for name in tar.getnames())
    assert len({line["repo"]["data_b64"] for line in lines}) == len(lines)
    # Built without network, from the environment's image: the wheel is there, and nothing else was added.
    labels = docker_api().inspect_image(image)["Config"]["Labels"]
    assert labels["crucible.package"] == "widthlib"

    events = InMemoryEventSink()
    worker = f"factory-deps-{os.getpid()}"  # not "test": other tests' sandboxes may be alive beside these
    sandboxes = DockerSandboxes(backend=backend, events=events, worker=worker, min_size=0, max_size=4)
    policy, _ = scripted
    try:
        row = db_session.execute(select(Task).where(Task.environment_name == NAME).order_by(Task.id)).scalars().first()
        assert row is not None and row.payload["image"] == image
        path, original = next(iter(row.payload["solution"]["files"].items()))
        policy.scripts["inverse"] = [hermes_call("write_file", path=path, content=original), hermes_call("submit")]
        policy.scripts["unrelated"] = [hermes_call("write_file", path="NOTES.md", content="looked\n"), hermes_call("submit")]
        for script, expected in (("inverse", 1.0), ("unrelated", 0.0)):
            task = factories.task(db_session, env, external_id=f"{row.external_id}-{script}",
                                  instruction=f"{row.instruction} [script:{script}]", payload=row.payload)
            _, (episode_id,) = factories.pending_group(db_session, env=env, the_task=task, name=f"deps-{script}")
            db_session.commit()
            run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker=worker)
            db_session.expire_all()
            episode = db_session.get(Episode, episode_id)
            assert episode is not None and episode.reward == expected, (script, episode.verifier_layers)
    finally:
        sandboxes.close()
    assert {e.detail["image"] for e in events.events if e.kind is EventKind.CREATE} == {image}
    assert backend.list(labels={L.WORKER: worker}) == []


def test_without_an_image_builder_a_package_with_requirements_is_reported_in_one_line(tmp_path: Path) -> None:
    def never() -> object:
        raise AssertionError("no sandbox is opened for a package that cannot run")

    lines, report = build_tasks(str(_package(tmp_path / "widthlib")), open_sandbox=never, workdir=tmp_path / "work")  # type: ignore[arg-type]
    assert lines == [] and report.error == ("widthlib: its tests need wcwidth==0.2.13; expected a way to build its image "
                                            "(crucible tasks factory builds one), got none")
    # With a builder, a requirement the index does not have: pip's own error, in the package's one line.
    lines, report = build_tasks(str(_package(tmp_path / "again")), open_sandbox=never, workdir=tmp_path / "work2",  # type: ignore[arg-type]
                                options=FactoryOptions(requirements=("no-such-project-crucible==9.9",)),
                                package_sandbox=lambda package, needs: (package_image("unused", package, needs), never))
    assert lines == [] and report.error is not None and "\n" not in report.error
    assert report.error.startswith("again: expected wheels for wcwidth==0.2.13, no-such-project-crucible==9.9 "
                                   "from the package index, got pip's error: ERROR: "), report.error


@pytest.mark.parametrize("value", ["evil @ http://127.0.0.1:9/x.whl", "--index-url=http://127.0.0.1/simple"])
def test_the_cli_refuses_a_requirement_not_from_the_index(tmp_path: Path, value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "cli.main", "tasks", "factory", str(tmp_path), "--out",
                           str(tmp_path / "t.jsonl"), "--with", value], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "--with: expected a requirement" in done.stderr + done.stdout
    assert not (tmp_path / "t.jsonl").exists()


def test_an_environment_that_does_not_allow_package_images_is_named_before_any_is_built(  # type: ignore[no-untyped-def]
        db_session: Session, tmp_path: Path, code_repo_image: str) -> None:
    register_environment(db_session, spec=parse_spec({**_spec(code_repo_image), "name": "factory-no-images"}))
    db_session.commit()
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "tasks", "factory", str(_package(tmp_path / "widthlib")), "--out",
         str(tmp_path / "t.jsonl"), "--env", "factory-no-images", "--output", "json"],
        cwd=ROOT, env={**os.environ, "COLUMNS": "250"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]  # no task written
    (report,) = json.loads(done.stdout)["packages"]
    assert report["image"] is None and report["tests_collected"] == 0
    assert report["error"] == ("widthlib: its tests need wcwidth==0.2.13, so its tasks run on an image of its own, and "
                               "environment 'factory-no-images' does not allow it: expected task_images to match "
                               "crucible-factory/*, got []")
