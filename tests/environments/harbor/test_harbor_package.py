"""Harbor tasks in and out with the `harbor` package itself (0.25.0, in its Debian 13 image: it needs Python 3.12 or
newer), end to end with a real dockerd, Postgres and Celery worker. `make test-harbor`; the reader image is built
on the first run (debootstrap of Debian 13, then harbor's wheels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Environment, Episode, Task
from environments.code_repo.task import CodeRepoTask, HarborTests
from environments.harbor.reader import read_tasks, reader_image
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.episode.runner import run_episode
from task_workers.policy.scripted import Samples
from tests import factories
from tests.factories import pending_group
from tests.support.calc import FIX as HERMES_FIX
from tests.support.calc import env_spec
from tests.support.episode_fixtures import wait_ended
from tests.support.harbor import INSTRUCTION, write_calc_task
from tests.support.programs import program_spec

pytestmark = [pytest.mark.harbor, pytest.mark.docker, pytest.mark.xdist_group("harbor")]
ROOT = Path(__file__).resolve().parents[3]
FIX = ["```bash\ncat /app/calc.py\n```", "```bash\nsed -i 's/a - b/a + b/' /app/calc.py\n```", "```bash\nexit\n```"]
WRONG = ["```bash\nsed -i 's/a - b/a * b/' /app/calc.py\n```", "```bash\nexit\n```"]


@pytest.fixture(scope="module")
def reader() -> str:
    return reader_image()


def _crucible(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def _register(session: Session, spec: dict) -> str:
    env, _ = register_environment(session, spec=parse_spec({**spec, "task_images": ["crucible-harbor/*"]}))
    session.commit()  # the CLI is another process
    return env.name


def test_a_harbor_folder_is_read_by_harbor_imported_played_by_an_agent_program_and_graded(
    db_session: Session, scripted, celery_worker, code_repo_image: str, reader: str, tmp_path: Path,
) -> None:
    policy, _ = scripted
    folder = write_calc_task(tmp_path, base_image=code_repo_image, instruction=INSTRUCTION + "[script:harbor]\n")
    name = _register(db_session, {**program_spec(code_repo_image, "harbor-programs"),
                                  "verifier": {"weights": {"rules": 0.0, "hidden_tests": 1.0}}})
    imported = _crucible("tasks", "import", name, str(folder), "--format", "harbor", "-o", "json")
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["imported"] == 1
    again = _crucible("tasks", "import", name, str(folder), "--format", "harbor", "-o", "json")  # an upsert
    assert again.returncode == 0 and json.loads(again.stdout)["imported"] == 1, again.stderr
    (task,) = db_session.execute(select(Task).where(Task.environment_name == name)).scalars()
    assert (task.external_id, task.instruction, task.split) == ("harbor-calc", INSTRUCTION + "[script:harbor]\n", "train")
    payload = CodeRepoTask.model_validate(task.payload)
    assert isinstance(payload.hidden_tests, HarborTests) and payload.hidden_tests.workdir == "/app"
    assert payload.hidden_tests.timeout_s == 60.0 and sorted(payload.hidden_tests.files) == ["test.sh", "test_outputs.py"]
    assert payload.image is not None and payload.image.startswith("crucible-harbor/")

    policy.scripts["harbor"] = Samples([FIX, WRONG])
    _, ids = pending_group(db_session, env=_env(db_session, name), the_task=task, size=2, name="run-harbor")
    db_session.commit()
    for episode_id in ids:
        celery_worker.send_task("crucible.run_episode", args=[episode_id], queue="agent_program")
    episodes = [wait_ended(db_session, episode_id, timeout=300) for episode_id in ids]
    assert [(e.status, e.termination_reason) for e in episodes] == [("completed", "program_exited")] * 2, \
        [(e.failures, e.program) for e in episodes]
    assert sorted(e.reward for e in episodes) == pytest.approx([0.0, 1.0])
    for episode in episodes:
        hidden = next(layer for layer in episode.verifier_layers if layer["name"] == "hidden_tests")
        assert hidden["detail"].startswith(f"tests/test.sh: exit 0; reward.txt: {episode.reward:g}"), hidden["detail"]
        assert "calc.py" in episode.final_diff


def _env(session: Session, name: str) -> Environment:
    return session.execute(select(Environment).where(Environment.name == name).order_by(Environment.version.desc())
                           ).scalars().first()


def test_a_crucible_task_is_exported_read_back_by_harbor_and_plays_again_after_import(
    db_session: Session, scripted, sandboxes, policy_client, code_repo_image: str, calc_payload: dict, reader: str,
    tmp_path: Path,
) -> None:
    policy, _ = scripted
    source = _register(db_session, {**env_spec("code-repo"), "name": "calc-source"})  # as examples/calc.yaml names it
    factories.task(db_session, _env(db_session, source), external_id="calc/add #1", payload=calc_payload,
                   instruction="Fix add() in calc.py. [script:roundtrip]")
    db_session.commit()
    out = tmp_path / "exported"
    exported = _crucible("tasks", "export", source, str(out), "--format", "harbor", "-o", "json")
    assert exported.returncode == 0, exported.stderr
    report = json.loads(exported.stdout)
    assert report == {"environment": source, "exported": 1, "out": str(out),
                      "read_back": {"harbor": "0.25.0", "tasks": ["calc-add-1"]}}
    folder = out / "calc-add-1"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "environment/Dockerfile", "environment/workspace/calc.py", "environment/workspace/tests/test_calc.py",
        "instruction.md", "solution/solve.sh", "task.toml", "tests/files/test_hidden.py", "tests/reward.py",
        "tests/test.sh"]
    assert (folder / "environment" / "Dockerfile").read_text().startswith(f"FROM {code_repo_image}\n")
    (read,) = read_tasks([folder])  # harbor's own model, once more, by hand
    assert read.instruction == "Fix add() in calc.py. [script:roundtrip]"
    assert read.config["verifier"]["timeout_sec"] == 60.0 and read.config["environment"]["workdir"] == "/workspace"
    assert read.config["metadata"] == {"source": "crucible", "environment": source, "external_id": "calc/add #1"}
    refused = _crucible("tasks", "export", source, str(out), "--format", "harbor")  # never over a folder
    assert refused.returncode == 2 and "calc-add-1: expected a new folder, got one that exists" in refused.stderr

    # And back in: the exported folder is a Harbor task like any other, its test.sh grading the hidden tests.
    target = _register(db_session, {**env_spec(code_repo_image), "name": "calc-again",
                                    "verifier": {"weights": {"rules": 0.0, "hidden_tests": 1.0}}})
    imported = _crucible("tasks", "import", target, str(folder), "--format", "harbor", "--split", "eval")
    assert imported.returncode == 0 and "imported 1 tasks into calc-again" in imported.stdout, imported.stderr
    (task,) = db_session.execute(select(Task).where(Task.environment_name == target)).scalars()
    assert task.split == "eval"
    policy.scripts["roundtrip"] = Samples([HERMES_FIX])
    _, (episode_id,) = pending_group(db_session, env=_env(db_session, target), the_task=task, name="run-roundtrip")
    db_session.commit()
    assert run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test").reward == pytest.approx(1.0)
    db_session.expire_all()
    hidden = next(layer for layer in db_session.get(Episode, episode_id).verifier_layers
                  if layer["name"] == "hidden_tests")
    assert hidden["detail"].startswith("tests/test.sh: exit 0; reward.txt: 1"), hidden["detail"]


@pytest.mark.parametrize("write, message", [
    (lambda f: (f / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n'),
     "expected a Harbor task folder, got harbor's error: ValidationError"),
    (lambda f: (f / "tests" / "test.sh").unlink(), "got harbor's error: FileNotFoundError"),
    (lambda f: ((f / "task.toml").write_text('[[steps]]\nname = "one"\n'), (f / "steps" / "one").mkdir(parents=True),
                (f / "steps" / "one" / "instruction.md").write_text("one\n")), "a multi-step task"),
    (lambda f: (f / "environment" / "Dockerfile").write_text("FROM crucible-test/not-here:1\n"),
     "environment/Dockerfile: docker build:"),
    (lambda f: (f / "tests" / "data.bin").write_bytes(b"\xff\xfe\x00"), "tests/data.bin: not UTF-8 text"),
    (lambda f: (f / "tests" / "link").symlink_to("/etc/passwd"), "Input paths must stay within the task"),
    (lambda f: (f / "tests" / "link").symlink_to("test.sh"), "tests/link: a symbolic link"),
])
def test_a_folder_harbor_or_the_build_refuses_is_one_line_naming_it_and_nothing_is_stored(
    db_session: Session, code_repo_image: str, reader: str, tmp_path: Path, write, message: str,
) -> None:
    name = _register(db_session, {**env_spec(code_repo_image), "name": "harbor-refusals"})
    good = write_calc_task(tmp_path, base_image=code_repo_image, name="good")
    bad = write_calc_task(tmp_path, base_image=code_repo_image, name="bad")
    write(bad)
    result = _crucible("tasks", "import", name, str(good), str(bad), "--format", "harbor")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0] and "bad" in lines[0], lines[0]
    db_session.expire_all()
    assert db_session.execute(select(Task).where(Task.environment_name == name)).first() is None  # not even good


def test_the_options_and_the_environment_are_checked_before_anything_is_read(
    db_session: Session, code_repo_image: str, reader: str, tmp_path: Path,
) -> None:
    name = _register(db_session, {**env_spec(code_repo_image), "name": "harbor-options"})
    plain, _ = register_environment(db_session, spec=parse_spec({**env_spec(code_repo_image), "name": "no-images"}))
    db_session.commit()
    folder = write_calc_task(tmp_path, base_image=code_repo_image)
    for args, expected in [
        ([name, "--format", "harbor"], "PATH: expected Harbor task folders for --format harbor, got none"),
        ([name, str(tmp_path / "missing"), "--format", "harbor"], "missing: expected a Harbor task folder"),
        ([name, str(folder), "--format", "harbor", "--seeds", "2"], "--seeds: expected only with a generated format"),
        ([name, str(folder), "--format", "harbor", "--repos-dir", "/tmp"], "--repos-dir: expected only with --format swebench"),
        ([name, str(folder), "--format", "harbor", "--image", "crucible-test/absent:1"],
         "image: expected an image on this engine, got 'crucible-test/absent:1'"),
        ([plain.name, str(folder), "--format", "harbor"],
         "image: expected an image the environment allows (none: 'no-images' has no task_images)"),
        ([name, str(folder), str(folder), "--format", "crucible"], "PATH: expected one JSONL task file"),
    ]:
        result = _crucible("tasks", "import", *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], (args, result.stderr)
    exported = _crucible("tasks", "export", name, str(tmp_path / "out"), "--format", "harbor")
    assert exported.returncode == 2 and "expected tasks to export, got none" in exported.stderr
    wrong = _crucible("tasks", "export", name, str(tmp_path / "out"), "--format", "swebench")
    assert wrong.returncode == 2 and "--format: expected one of harbor, got 'swebench'" in wrong.stderr


def test_the_shipped_example_imports_as_the_readme_says(db_session: Session, sandbox_images, reader: str) -> None:
    """examples/harbor.yaml and its folder, as they are: the environment FROM crucible/code-repo:latest."""
    from environments.spec import load_spec_file

    register_environment(db_session, spec=load_spec_file(ROOT / "examples" / "harbor.yaml"))
    db_session.commit()
    imported = _crucible("tasks", "import", "harbor", str(ROOT / "examples" / "harbor" / "fix-calc"), "--format",
                         "harbor", "-o", "json")
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout) == {"environment": "harbor", "imported": 1, "code_repo_tasks": 1,
                                           "unblinded_tasks": 1}
    listed = _crucible("tasks", "ls", "harbor", "-o", "json")
    assert [row["blinding"] for row in json.loads(listed.stdout)] == ["unblinded: a Harbor task's tests/test.sh"]
