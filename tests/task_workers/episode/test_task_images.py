"""A task on its own image (SWE-bench ships one per instance), end to end with a real dockerd and Postgres.

The images are built here the way SWE-bench builds its instance images: the environment's image plus a
repository at /testbed, checked out at the base commit. One keeps only the base and its past; the others
keep what came after it — a later commit under a branch (SWE-bench#465), a stray blob of the fix, the
fix already in the working tree — and every one of those is refused before the agent sees it.
"""

from __future__ import annotations

import json
import os
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.errors import ConfigError
from core.models import Episode, Turn
from environments.code_repo.task import CodeRepoTask, ImageRepo, TestSpec
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from environments.tasks import import_tasks, import_uploaded
from sandboxes import InMemoryEventSink
from sandboxes.docker_client import docker_api
from sandboxes.events import EventKind
from task_workers.episode.errors import TaskRefusedFault
from task_workers.episode.runner import run_episode
from tests import factories
from tests.support.calc import BUGGY, FIX, HIDDEN_TEST, PUBLIC_TEST, env_spec

pytestmark = pytest.mark.xdist_group("task-images")

PREFIX = "crucible-test/sweb.eval"
INSTANCE = "acme__calc-1"
TEST_PATCH = ("diff --git a/test_hidden.py b/test_hidden.py\nnew file mode 100644\n--- /dev/null\n+++ b/test_hidden.py\n"
              "@@ -0,0 +1,5 @@\n" + "".join(f"+{line}\n" for line in HIDDEN_TEST.splitlines()))
FIXED = BUGGY.replace("a - b", "a + b")
LEAKS = ("none", "later-commit", "stray-blob", "pack-without-index", "objects-file", "swapped-blob", "fixed-tree",
         "untracked-copy", "vendored-clone", "submodule-store", "swebench-setup", "changing-setup-commit")
TAG = f"p{os.getpid()}"  # per process: a run that splits this module over workers builds one image in each
IMAGE = f"{PREFIX}.acme_1776_calc-1:{TAG}"
"""One image holds every instance's repository, each at its own path (/testbed: the clean one): one build."""


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@x",
           "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _testbed(root: Path, leak: str) -> tuple[Path, str]:
    """A repository with a past, checked out at the base; `leak` says what else it keeps."""
    repo = root / "testbed"
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    raise NotImplementedError\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "a past before the base")
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests" / "test_calc.py").write_text(PUBLIC_TEST)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the base")
    base = _git(repo, "rev-parse", "HEAD")
    if leak == "later-commit":  # upstream's history kept: the fix is one `git log --all -p` away
        _git(repo, "checkout", "-q", "-b", "upstream")
        (repo / "calc.py").write_text(FIXED)
        _git(repo, "commit", "-q", "-am", "fix add")
        _git(repo, "checkout", "-q", "main")
    elif leak == "stray-blob":  # no ref names it; `git cat-file --batch-all-objects` still finds it
        (repo / "fix.txt").write_text(FIXED)
        _git(repo, "hash-object", "-w", "fix.txt")
        (repo / "fix.txt").unlink()
    elif leak == "pack-without-index":  # git lists no object of a pack whose .idx is gone, and exits 0
        (repo / "fix.txt").write_text(FIXED)
        blob = _git(repo, "hash-object", "-w", "fix.txt")
        (repo / "fix.txt").unlink()
        pack = repo / ".git" / "objects" / "pack"
        pack.mkdir(exist_ok=True)
        name = subprocess.run(["git", "-C", str(repo), "pack-objects", "-q", str(pack / "tmp_pack")], input=blob + "\n",
                              check=True, capture_output=True, text=True).stdout.strip()
        (pack / f"tmp_pack-{name}.idx").unlink()
        loose = repo / ".git" / "objects" / blob[:2] / blob[2:]
        loose.unlink()
    elif leak == "objects-file":  # a file where a directory of loose objects belongs stops git's listing
        (repo / "fix.txt").write_text(FIXED)
        _git(repo, "hash-object", "-w", "fix.txt")
        (repo / "fix.txt").unlink()
        (repo / ".git" / "objects" / "00").write_text("not a directory\n")
    elif leak == "swapped-blob":  # the base's own blob id, holding the fix: nothing lists it as extra
        blob = _git(repo, "rev-parse", "HEAD:calc.py")
        loose = repo / ".git" / "objects" / blob[:2] / blob[2:]
        loose.chmod(0o644)
        loose.write_bytes(zlib.compress(b"blob %d\0" % len(FIXED.encode()) + FIXED.encode()))
    elif leak == "fixed-tree":  # HEAD is the base, the fix in the files, hidden from git's index
        (repo / "calc.py").write_text(FIXED)
        _git(repo, "update-index", "--assume-unchanged", "calc.py")
    elif leak == "untracked-copy":  # beside the code, in no commit, not ignored
        (repo / "calc.py.orig").write_text(FIXED)
    elif leak == "vendored-clone":  # another repository in the working tree, with the fix in its history
        vendored = repo / "vendor" / "calc"
        vendored.mkdir(parents=True)
        _git(vendored, "init", "-q", "-b", "main")
        (vendored / "calc.py").write_text(FIXED)
        _git(vendored, "add", "-A")
        _git(vendored, "commit", "-q", "-m", "upstream fix")
        (repo / ".gitignore").write_text("vendor/\n")
    elif leak == "submodule-store":  # a nested repository's objects are not in the main store
        (repo / ".git" / "modules" / "vendored").mkdir(parents=True)
        (repo / ".git" / "modules" / "vendored" / "HEAD").write_text("ref: refs/heads/main\n")
    elif leak == "swebench-setup":  # as SWE-bench's own images: release tags, a build, the install committed on top
        (repo / ".gitignore").write_text("build/\n")
        _git(repo, "add", ".gitignore")
        _git(repo, "commit", "-q", "-m", "ignore the build")
        base = _git(repo, "rev-parse", "HEAD")
        _git(repo, "tag", "-a", "v0.1", "-m", "a release before the base", "HEAD~2")
        (repo / "build").mkdir()
        (repo / "build" / "compiled.txt").write_text("made by the image's build\n")  # ignored: exported as it is
        _git(repo, "commit", "-q", "--allow-empty", "-m", "SWE-bench")
    elif leak == "changing-setup-commit":  # a commit on top of the base that changes a file: history after it
        (repo / "calc.py").write_text(FIXED)
        _git(repo, "commit", "-q", "-am", "SWE-bench")
    return repo, base


@pytest.fixture(scope="module")
def instance_images(code_repo_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str, str]]]:
    """leak → (image tag, base commit, the repository's path in the image)."""
    context = tmp_path_factory.mktemp("instances")
    copies, images = [], {}
    for leak in LEAKS:
        path = "/testbed" if leak == "none" else f"/testbed-{leak}"
        _, base = _testbed(context / leak, leak)
        copies.append(f"COPY {leak}/testbed {path}")
        images[leak] = (IMAGE, base, path)
    (context / "Dockerfile").write_text(f"FROM {code_repo_image}\nUSER root\n" + "\n".join(copies) + "\n")
    for chunk in docker_api().build(path=str(context), tag=IMAGE, network_mode="none", rm=True, forcerm=True,
                                    pull=False, decode=True):
        assert "error" not in chunk, chunk
    yield images
    docker_api().remove_image(IMAGE, force=True)


def _environment(session: Session, image: str, *, task_images: list[str]):
    spec = {**env_spec(image), "name": "swe-images", "task_images": task_images}
    env, _ = register_environment(session, spec=parse_spec(spec))
    session.flush()
    return env


def _payload(image: str, base: str, path: str = "/testbed") -> dict:
    task = CodeRepoTask(image=image, repo=ImageRepo(format="image", commit=base, path=path),
                        public_tests=TestSpec(paths=["tests"], timeout_s=60),
                        hidden_tests=TestSpec(paths=["test_hidden.py"], files={"test_hidden.py": HIDDEN_TEST}, timeout_s=60))
    return task.model_dump(mode="json")


def _episode(session: Session, env, payload: dict, name: str) -> int:
    task = factories.task(session, env, external_id=name, instruction=f"Fix add(). [script:{name}]", payload=payload)
    _, (episode_id,) = factories.pending_group(session, env=env, the_task=task, name=f"run-{name}")
    session.commit()
    return episode_id


def _leaked(events: InMemoryEventSink) -> set[str]:
    created = {e.sandbox_id for e in events.events if e.kind is EventKind.CREATE}
    return created - {e.sandbox_id for e in events.events if e.kind is EventKind.DESTROY}


def test_the_agent_and_every_grading_sandbox_run_on_the_tasks_own_image(
        db_session, scripted, sandboxes, events, policy_client, code_repo_image, instance_images) -> None:
    policy, _ = scripted
    image, base, path = instance_images["none"]
    env = _environment(db_session, code_repo_image, task_images=[f"{PREFIX}.*"])
    policy.scripts["fix"] = FIX
    policy.scripts["wrong"] = [hermes_call("edit_file", path="calc.py", old_str="return a - b", new_str="return a * b"),
                               hermes_call("submit")]
    right = _episode(db_session, env, _payload(image, base, path), "fix")
    wrong = _episode(db_session, env, _payload(image, base, path), "wrong")

    assert run_episode(right, policy=policy_client, sandboxes=sandboxes, worker="test").reward == pytest.approx(1.0)
    assert run_episode(wrong, policy=policy_client, sandboxes=sandboxes, worker="test").reward == pytest.approx(0.3)
    db_session.expire_all()
    episode = db_session.get(Episode, right)
    assert episode.reward_components == {"rules": 1.0, "public_tests": 1.0, "hidden_tests": 1.0}
    assert "return a + b" in episode.final_diff and "test_hidden" not in episode.final_diff
    creates = [e for e in events.events if e.kind is EventKind.CREATE]
    # the agent's sandbox and the grader's fresh ones (public and hidden tests), both episodes: all of the image
    assert len(creates) >= 4 and {e.detail["image"] for e in creates} == {image}
    assert not _leaked(events)  # none pooled: every one was made for its episode and removed after it
    assert sandboxes._pools._pools == {}


@pytest.mark.parametrize("leak", ["fixed-tree", "swebench-setup"])
def test_the_agent_sees_the_exported_base_and_never_the_images_repository(
        db_session, scripted, sandboxes, events, policy_client, code_repo_image, instance_images, leak) -> None:
    """The fix sits in the image's working tree (hidden from git's index with assume-unchanged): the agent's
    workspace holds the base's file, from the base's objects, and the image's directory cannot be read."""
    policy, _ = scripted
    image, base, path = instance_images[leak]
    env = _environment(db_session, code_repo_image, task_images=[f"{PREFIX}.*"])
    peek = hermes_call("bash", command=f"ls -la {path}; cat {path}/calc.py; git -C {path} log --all --oneline; "
                                       f"cat {path}/.git/HEAD; cat calc.py; ls build 2>&1; echo PEEKED")
    policy.scripts[f"peek-{leak}"] = [peek, *FIX]
    episode_id = _episode(db_session, env, _payload(image, base, path), f"peek-{leak}")
    assert run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test").reward == pytest.approx(1.0)
    db_session.expire_all()
    (first, *_) = db_session.execute(select(Turn).where(Turn.episode_id == episode_id).order_by(Turn.index)).scalars()
    seen = first.observation
    assert "PEEKED" in seen and f"cat: {path}/calc.py: No such file" in seen, seen  # an empty directory now
    assert "not a git repository" in seen and f"cat: {path}/.git/HEAD: No such file" in seen
    assert "return a - b" in seen and "return a + b" not in seen  # the workspace's calc.py is the base's
    assert ("compiled.txt" in seen) is (leak == "swebench-setup")  # ignored build output comes along
    assert not _leaked(events)


@pytest.mark.parametrize("leak, reason", [
    ("later-commit", "objects not in the base's history"),
    ("stray-blob", "objects not in the base's history"),
    ("pack-without-index", "files that are not objects"),
    ("objects-file", "could not read all of its object store"),
    ("swapped-blob", "do not hash to their ids"),
    ("untracked-copy", "neither tracked nor ignored: calc.py.orig"),
    ("vendored-clone", r"another repository inside the working tree \(./vendor/calc/.git\)"),
    ("submodule-store", "nested repositories"),
    ("changing-setup-commit", "has commits after the base .* that change files"),
])
def test_an_image_that_keeps_what_came_after_the_base_is_refused(
        db_session, scripted, sandboxes, events, policy_client, code_repo_image, instance_images, leak, reason) -> None:
    policy, _ = scripted
    image, base, path = instance_images[leak]
    env = _environment(db_session, code_repo_image, task_images=[f"{PREFIX}.*"])
    policy.scripts[leak] = FIX
    episode_id = _episode(db_session, env, _payload(image, base, path), leak)
    with pytest.raises(TaskRefusedFault, match=reason) as refused:
        run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    assert not refused.value.retry and image in str(refused.value)
    assert policy.requests == 0  # refused before the agent's first turn
    db_session.expire_all()
    assert db_session.execute(select(Episode.final_diff).where(Episode.id == episode_id)).scalar_one() is None
    assert not _leaked(events)


def test_an_image_the_environment_does_not_allow_is_refused_at_import_and_at_play(
        db_session, scripted, sandboxes, policy_client, code_repo_image, instance_images, tmp_path) -> None:
    image, base, path = instance_images["none"]
    env = _environment(db_session, code_repo_image, task_images=["someone-else/*"])
    line = {"id": "t1", "instruction": "fix add", "image": image, "repo": {"format": "image", "commit": base},
            "hidden_tests": {"paths": ["test_hidden.py"], "files": {"test_hidden.py": HIDDEN_TEST}}}
    with pytest.raises(ConfigError, match=r"task 't1': image: expected an image the environment allows \(someone-else/\*\)"):
        import_uploaded(db_session, environment=env.name, lines=[json.dumps(line)])
    # stored anyway (by hand, as an older spec allowed it): the episode's spec refuses it, not retried
    episode_id = _episode(db_session, env, _payload(image, base, path), "not-allowed")
    with pytest.raises(TaskRefusedFault, match="task_images allows"):
        run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")


@pytest.mark.parametrize("image", ["--privileged", "Upper/case", "a b", "x;rm -rf /", "img\n", "a" * 400, "../etc:tag",
                                   "ok:tag with space", "ok@sha256:short"])
def test_a_hostile_image_name_is_refused_at_import(db_session, code_repo_image, image) -> None:
    env = _environment(db_session, code_repo_image, task_images=["*"])
    line = {"id": "t1", "instruction": "fix add", "image": image, "repo": {"format": "image", "commit": "a" * 40},
            "hidden_tests": {"paths": ["test_hidden.py"]}}
    with pytest.raises(ConfigError, match=r"^line:1: image: .*expected an image reference such as"):
        import_uploaded(db_session, environment=env.name, lines=[json.dumps(line)])


@pytest.mark.parametrize("repo, message", [
    ({"format": "image", "commit": "HEAD"}, "repo.commit"),
    ({"format": "image", "commit": "a" * 40, "path": "/testbed/../etc"}, "repo.path"),
    ({"format": "image", "commit": "a" * 40, "path": "testbed"}, "repo.path"),
    ({"format": "image", "commit": "a" * 40, "path": "/"}, "repo.path"),
])
def test_an_image_repository_is_named_by_a_full_commit_and_an_absolute_path(db_session, code_repo_image, repo,
                                                                          message) -> None:
    env = _environment(db_session, code_repo_image, task_images=["*"])
    line = {"id": "t1", "instruction": "fix add", "image": "sweb.eval.x", "repo": repo,
            "hidden_tests": {"paths": ["test_hidden.py"]}}
    with pytest.raises(ConfigError, match=rf"^line:1: {message}"):
        import_uploaded(db_session, environment=env.name, lines=[json.dumps(line)])


def test_a_swebench_file_imports_onto_each_instances_image_and_grades_there(
        db_session, scripted, sandboxes, events, policy_client, code_repo_image, instance_images, tmp_path) -> None:
    policy, _ = scripted
    image, base, path = instance_images["none"]
    assert image == f"{PREFIX}.acme_1776_calc-1:{TAG}" and path == "/testbed"
    env = _environment(db_session, code_repo_image, task_images=[f"{PREFIX}.*"])
    instance = {"instance_id": INSTANCE, "repo": "acme/calc", "base_commit": base,
                "problem_statement": "add() subtracts. [script:swe]", "test_patch": TEST_PATCH,
                "FAIL_TO_PASS": json.dumps(["test_hidden.py::test_add"]),
                "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mul"])}
    path = tmp_path / "swe.jsonl"
    path.write_text(json.dumps(instance) + "\n")
    for bad, message in ((f"{PREFIX}.{{nope}}:{TAG}", "naming only"), ("--x {instance_key}", "image reference template"),
                         ("{instance_id:1999999999}", "naming only"), ("x{0}", "naming only"), ("x}", "naming only")):
        with pytest.raises(ConfigError, match=message):
            import_tasks(db_session, environment=env.name, path=path, format="swebench", image=bad)
    with pytest.raises(ConfigError, match="repos_dir: expected none with an image template"):
        import_tasks(db_session, environment=env.name, path=path, format="swebench", image=image, repos_dir=tmp_path)
    assert import_tasks(db_session, environment=env.name, path=path, format="swebench",
                        image=f"{PREFIX}.{{instance_key}}:{TAG}") == 1
    from core.models import Task

    task = db_session.execute(select(Task).where(Task.environment_name == env.name)).scalar_one()
    assert task.payload["image"] == image and task.payload["repo"] == {"format": "image", "path": "/testbed",
                                                                       "commit": base}
    policy.scripts["swe"] = FIX
    _, (episode_id,) = factories.pending_group(db_session, env=env, the_task=task, name="run-swe")
    db_session.commit()
    outcome = run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    assert outcome.reward == pytest.approx(1.0)
    assert {e.detail["image"] for e in events.events if e.kind is EventKind.CREATE} == {image}
