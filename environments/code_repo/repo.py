"""The repository side of a code_repo episode: put the task's repository into a sandbox as a git repo
with a deterministic base commit, and take the agent's work back out without trusting anything the
agent could have changed.

    base = install_repo(sandbox, task)            # the base commit id; the worker records it
    tree = read_workspace(agent_sandbox)          # the agent's files (a tar), read as the keeper uid
    git = check_git(agent_sandbox, base=base)     # did the agent rewrite history or delete .git?
    diff = load_submission(grader, tree, base=base)   # fresh sandbox: base + the agent's files → diff

The diff is computed in a fresh sandbox, by our own git, against the base commit id the worker
recorded — not against a tag or ref inside the agent's sandbox, and not by a git whose config,
hooks or attributes the agent wrote — so rewriting history changes nothing, and the stored diff is
exactly the tree that is graded.

The bash programs that run in the sandbox (and the Python one the export runs) are files of sandbox/, read
as package resources: export_image_repo.sh with verify_export.py, read_workspace.sh, check_git.sh and
load_submission.sh.
"""

from __future__ import annotations

import base64
import fnmatch
import logging
import shlex
from dataclasses import dataclass
from importlib import resources

from core.errors import ConfigError
from environments.base import Sandbox
from environments.base import TaskRefused as BaseTaskRefused
from environments.code_repo.snapshot import MAX_SNAPSHOT_BYTES, check_snapshot
from environments.code_repo.task import BUNDLE_REF, CodeRepoTask, ImageRepo, RepoSnapshot
from sandboxes.layout import KEEPER_DIR, privileged_argv

WORKSPACE = "/workspace"
BASE_TAG = "crucible-base"
# Byproducts of running code are not part of a submission (nor are nested repositories).
NOT_SUBMITTED = (".git", "__pycache__", "*.pyc", ".pytest_cache")
# Fixed identity and dates: the same task gives the same base commit id in every sandbox.
GIT_ENV = ("HOME=/nonexistent GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 "
           "GIT_AUTHOR_NAME=crucible GIT_AUTHOR_EMAIL=crucible@localhost GIT_COMMITTER_NAME=crucible "
           "GIT_COMMITTER_EMAIL=crucible@localhost GIT_AUTHOR_DATE=2000-01-01T00:00:00Z "
           "GIT_COMMITTER_DATE=2000-01-01T00:00:00Z")
GIT = ("git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false "
       "-c core.excludesFile=/dev/null -c init.defaultBranch=main -c core.quotepath=false")
# Attributes the agent wrote must not change what our git stores or shows: .git/info/attributes
# outranks every .gitattributes in the tree.
NEUTRAL_ATTRIBUTES = "* -text -filter -ident -working-tree-encoding !eol !diff !merge\n"
MAX_SUBMISSION_BYTES = 64 << 20
_FULL = ("No space left on device", "Disk quota exceeded", "File too large")
log = logging.getLogger(__name__)
TRANSFER_TIMEOUT_S = 300.0


class SetupError(RuntimeError):
    """The task could not be put in place: an infrastructure fault, never the agent's."""


class TaskRefused(SetupError, BaseTaskRefused):
    """The task's own image is not fit to train on (its repository holds what came after the base)."""


class SubmissionError(RuntimeError):
    """The agent's work cannot be graded because of what the agent did (unreadable or oversized
    workspace, a tree that cannot be unpacked): scored 0 with this message, never retried."""


def _run(sandbox: Sandbox, command: str, *, timeout_s: float = 120) -> str:
    # A subshell: the agent's persistent shell keeps its own HOME and variables.
    step = sandbox.step(f"(export {GIT_ENV}; {command})", timeout_s=timeout_s)
    if step.exit_code != 0:
        raise SetupError(f"`{command}` exited {step.exit_code} ({step.status}): {step.output[-800:]}")
    return str(step.output)


def _program(name: str, placeholders: dict[str, str] | None = None) -> str:
    """A program of sandbox/, as the sandbox receives it (shellcheck and ruff read the same file), each
    placeholder (which must occur exactly once) replaced by its value."""
    text = resources.files("environments.code_repo").joinpath("sandbox", name).read_text(encoding="utf-8")
    for placeholder, value in (placeholders or {}).items():
        if text.count(placeholder) != 1:
            raise RuntimeError(f"sandbox/{name}: expected {placeholder} once, found it {text.count(placeholder)} times")
        text = text.replace(placeholder, value)
    return text


def _exec(sandbox: Sandbox, script: str, *args: str, stdin: bytes | None = None, as_keeper: bool = False,
          timeout_s: float = TRANSFER_TIMEOUT_S) -> tuple[int, bytes, str]:
    """A one-off bash process outside the agent's shell; returns (exit code, stdout, stderr text). It starts with an
    empty environment (privileged_argv's), never the image's: a task's image may set BASH_ENV, LD_LIBRARY_PATH or
    PYTHONPATH to a directory of the workspace, which in a grading sandbox holds the submission."""
    result = sandbox.exec(privileged_argv(["bash", "-c", f"export {GIT_ENV}; {script}", "crucible", *args]),
                          stdin=stdin, as_keeper=as_keeper, timeout_s=timeout_s)
    return result.exit_code, bytes(result.output), bytes(result.stderr).decode(errors="replace").strip()[-800:]


_EXPORT_IMAGE_REPO = _program("export_image_repo.sh")
_VERIFY_EXPORT = _program("verify_export.py")
"""Every exported file hashed again against the base's tree: git reads a loose object without checking that
its content hashes to its id, so a swapped object would export other content under the base's ids."""


def export_image_repo(sandbox: Sandbox, repo: ImageRepo) -> RepoSnapshot:
    """The base tree of the repository a task's image holds, as a checked tarball, made in a sandbox of that
    image that no agent uses. TaskRefused (naming why) unless HEAD is the base, every git object stored is
    in the base's history and the store reads cleanly, no other repository sits in the tree, and every
    untracked file is one .gitignore covers. The tracked files come from the base's objects, each hashed
    again; the image's working tree and index are never trusted. The agent's sandboxes hide the directory
    (CodeRepoTask.masked_paths): this export is all of it they see."""
    code, data, errors = _exec(sandbox, f"VERIFY={shlex.quote(_VERIFY_EXPORT)}; {_EXPORT_IMAGE_REPO}", repo.path,
                               repo.commit, str(MAX_SNAPSHOT_BYTES + 1), KEEPER_DIR, as_keeper=True,
                               timeout_s=TRANSFER_TIMEOUT_S)
    if code == 14:
        raise TaskRefused(f"image {sandbox.image}: {errors.strip()[-600:]}")
    if code != 0:
        raise SetupError(f"exporting the image's repository at {repo.path} exited {code}: {errors[-400:]}")
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise TaskRefused(f"image {sandbox.image}: its repository at {repo.path} packs to more than "
                          f"{MAX_SNAPSHOT_BYTES >> 20} MiB")
    snapshot = RepoSnapshot(format="tar", data_b64=base64.b64encode(data).decode())
    try:
        check_snapshot(snapshot, where=f"image {sandbox.image}: {repo.path}")
    except ConfigError as error:  # a link out of the tree, a device: refused like any uploaded archive
        raise TaskRefused(str(error)) from None
    return snapshot


def install_repo(sandbox: Sandbox, task: CodeRepoTask) -> str:
    """Unpack the snapshot (or the export of the image's repository) into the workspace, add the public
    test files, commit that as the base (tagged `crucible-base` for the agent's convenience) and return the
    base commit id."""
    try:
        snapshot = task.snapshot()  # an image's repository: its checked export (export_image_repo)
    except RuntimeError as error:
        raise SetupError(str(error)) from None
    if snapshot.format == "tar":
        sandbox.put_files({"/tmp/crucible-repo.tar.gz": snapshot.data})
        _run(sandbox, f"cd {WORKSPACE} && tar -xzf /tmp/crucible-repo.tar.gz && rm /tmp/crucible-repo.tar.gz "
                      f"&& {GIT} init -q")
    else:
        sandbox.put_files({"/tmp/crucible-repo.bundle": snapshot.data})
        _run(sandbox, f"cd {WORKSPACE} && {GIT} init -q && {GIT} fetch -q /tmp/crucible-repo.bundle "
                      f"'{BUNDLE_REF}:{BUNDLE_REF}' && {GIT} checkout -q -B main {BUNDLE_REF} "
                      f"&& {GIT} update-ref -d {BUNDLE_REF} && rm /tmp/crucible-repo.bundle")
    if task.public_tests and task.public_tests.files:
        sandbox.put_files({f"{WORKSPACE}/{path}": content.encode() for path, content in task.public_tests.files.items()})
    excluded = " ".join(shlex.quote(pattern) for pattern in NOT_SUBMITTED[1:])
    _run(sandbox, f"cd {WORKSPACE} && printf '%s\\n' {excluded} >> .git/info/exclude")
    output = _run(sandbox, f"cd {WORKSPACE} && {GIT} add -A -f && {GIT} commit -q --allow-empty -m 'crucible base' "
                           f"&& {GIT} tag -f {BASE_TAG} >/dev/null && {GIT} rev-parse HEAD")
    return output.strip().splitlines()[-1]


_READ_WORKSPACE = _program("read_workspace.sh")


def stop_agent_processes(sandbox: Sandbox) -> None:
    """SIGKILL every process of the agent's uid (its shell, anything it left running) so that the
    workspace holds still while it is read. The keeper's processes cannot be signalled by it."""
    _exec(sandbox, "kill -9 -1 2>/dev/null; exit 0", timeout_s=30)


def read_workspace(sandbox: Sandbox) -> bytes:
    """The agent's files as a tar (no .git, no byproducts), read by the keeper uid, which the agent's
    processes cannot signal or impersonate. Raises SubmissionError when the agent made it unreadable."""
    stop_agent_processes(sandbox)
    code, data, errors = _exec(sandbox, _READ_WORKSPACE, WORKSPACE, str(MAX_SUBMISSION_BYTES + 1), *NOT_SUBMITTED,
                               as_keeper=True)
    if len(data) > MAX_SUBMISSION_BYTES:
        raise SubmissionError(f"the workspace holds more than {MAX_SUBMISSION_BYTES >> 20} MiB (sparse files count "
                              "at their full size); expected at most that to grade")
    if code != 0:
        raise SubmissionError(f"the workspace could not be read (tar exited {code}): {errors[-400:]}")
    return data


_CHECK_GIT = _program("check_git.sh")


@dataclass(frozen=True)
class GitState:
    problems: list[str]
    """What the agent did to the repository's history; empty when the base is intact."""


def check_git(sandbox: Sandbox, *, base: str) -> GitState:
    """Inspect the agent's .git (as the keeper, hooks and fsmonitor off): is the base commit still in
    HEAD's history, does the base tag still name it, were objects replaced?"""
    _, out, _ = _exec(sandbox, _CHECK_GIT, WORKSPACE, base, as_keeper=True, timeout_s=60)
    fields = dict(item.partition("=")[::2] for item in out.decode(errors="replace").split())
    state = fields.get("state")
    if state == "no-workspace":
        return GitState(["the workspace is gone"])
    if state == "no-git":
        return GitState(["the workspace is no longer a git repository (.git was deleted)"])
    problems = []
    if state != "repo":
        problems.append("the repository could not be read")
    if fields.get("tag") != base:
        problems.append(f"the {BASE_TAG} tag was moved or deleted")
    if fields.get("ancestor") != "yes":
        problems.append("the base commit is no longer in HEAD's history")
    if fields.get("replaced") == "yes":
        problems.append("objects were replaced (refs/replace or grafts)")
    return GitState(problems)


_LOAD_SUBMISSION = _program("load_submission.sh", {"@GIT@": GIT})
"""Its one git command is ours (GIT: our options, no config of the agent's)."""


def load_submission(sandbox: Sandbox, tree: bytes, *, base: str) -> None:
    """Replace a fresh sandbox's base checkout with the agent's files and stage them, so that the
    index holds exactly base + the agent's change. SubmissionError when the tree cannot be unpacked."""
    code, _, errors = _exec(sandbox, _LOAD_SUBMISSION, WORKSPACE, base, NEUTRAL_ATTRIBUTES, stdin=tree)
    # The tree is one the worker packed itself (read_workspace, from a workspace of the same size): only a
    # full workspace is the agent's doing. Clearing the fresh checkout (step 4) or unpacking for any other
    # reason failing is the grader's fault — retried, never scored as the agent's outcome.
    if code == 5 and any(sign in errors for sign in _FULL):
        raise SubmissionError(f"the submitted tree could not be unpacked: it does not fit in the workspace: {errors[-400:]}")
    if code == 7:
        raise SubmissionError(f"git could not stage the submitted tree: {errors[-400:]}")
    if code != 0:
        log.warning("load_submission failed at step %s: %s", code, errors[-800:])
        raise SetupError(f"loading the submission into a fresh sandbox failed (step {code}): {errors[-400:]}")


def staged_diff(sandbox: Sandbox, *, base: str) -> bytes:
    """The staged change against the base commit id, binary-safe."""
    code, data, errors = _exec(sandbox, f"cd {WORKSPACE} && {GIT} diff --cached --binary --no-color --no-ext-diff "
                                        f"--no-textconv --no-renames {base}")
    if code != 0:
        raise SetupError(f"git diff: expected exit 0, got {code}: {errors[-400:]}")
    return data


def changed_files(sandbox: Sandbox, *, base: str) -> list[tuple[str, str]]:
    """(status, path) of every staged change: A added, M modified, D deleted, T type changed."""
    code, data, errors = _exec(sandbox, f"cd {WORKSPACE} && {GIT} diff --cached --name-status -z --no-renames {base}")
    if code != 0:
        raise SetupError(f"git diff --name-status: expected exit 0, got {code}: {errors[-400:]}")
    fields = data.decode(errors="surrogateescape").split("\0")
    return [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2)]


@dataclass(frozen=True)
class Blob:
    mode: str
    """git's file mode: 100644, 100755, 120000 (a symbolic link: the data is its target), 160000."""
    data: bytes


def staged_blobs(sandbox: Sandbox, paths: list[str], *, base: str | None = None) -> dict[str, Blob]:
    """What the grader's index (or, with `base`, the base commit) holds at `paths`: read from git's
    objects, never from the tree, so links and hard links cannot hide a file's content."""
    if not paths:
        return {}
    code, listing, errors = _exec(sandbox, f"cd {WORKSPACE} && {GIT} ls-files -s -z -- \"$@\"" if base is None
                                  else f"cd {WORKSPACE} && {GIT} ls-tree -r -z {base} -- \"$@\"", *paths)
    if code != 0:
        raise SetupError(f"git ls-files: expected exit 0, got {code}: {errors[-400:]}")
    entries = {}  # path -> (mode, sha)
    for record in listing.decode(errors="surrogateescape").split("\0"):
        meta, _, path = record.partition("\t")
        fields = meta.split()
        if path and len(fields) >= 3 and fields[0] != "160000":  # a submodule link has no blob here
            entries[path] = (fields[0], fields[1] if base is None else fields[2])
    if not entries:
        return {}
    shas = "".join(f"{sha}\n" for _, sha in entries.values()).encode()
    code, data, errors = _exec(sandbox, f"cd {WORKSPACE} && {GIT} cat-file --batch", stdin=shas)
    if code != 0:
        raise SetupError(f"git cat-file: expected exit 0, got {code}: {errors[-400:]}")
    blobs, offset = {}, 0
    for path, (mode, _) in entries.items():
        header_end = data.index(b"\n", offset)
        size = int(data[offset:header_end].split()[2])
        blobs[path] = Blob(mode, data[header_end + 1:header_end + 1 + size])
        offset = header_end + 1 + size + 1
    return blobs


_MODULES = "import pkgutil, sys; print(*sorted({m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)))"


def installed_modules(sandbox: Sandbox) -> frozenset[str]:
    """The top-level modules the grader's interpreter imports without the workspace (stdlib, packages)."""
    code, out, errors = _exec(sandbox, f"cd / && python3 -I -c {shlex.quote(_MODULES)}", timeout_s=60)
    if code != 0:
        raise SetupError(f"listing installed modules: expected exit 0, got {code}: {errors[-400:]}")
    return frozenset(out.decode().split())


def forget_history(sandbox: Sandbox) -> None:
    """Remove the grading sandbox's git directory once the diff is checked: its base commit holds the test
    files as the repository had them (expected values and all), which the blinded tests must not find."""
    code, _, errors = _exec(sandbox, f"rm -rf -- {WORKSPACE}/.git")
    if code != 0:
        raise SetupError(f"removing the grading sandbox's .git: expected exit 0, got {code}: {errors[-400:]}")


def apply_patch(sandbox: Sandbox, patch: str, *, name: str) -> str | None:
    """Apply a task's patch (SWE-bench's test_patch); the error text when it does not apply."""
    if not patch.strip():
        return None
    code, _, errors = _exec(sandbox, f"cd {WORKSPACE} && {GIT} apply --binary --whitespace=nowarn -", stdin=patch.encode())
    return None if code == 0 else f"the task's {name} does not apply to the submission: {errors[-400:]}"


def matches(path: str, globs: list[str]) -> bool:
    """A glob without "/" matches a file's name at any depth; one with "/" the whole path."""
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name if "/" not in glob else path, glob) for glob in globs)
