"""The payload of a code_repo task, and how a repository snapshot is packed into it."""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

# The snapshot and its packers live beside their safety checks; re-exported here for the payload's users.
from environments.code_repo.snapshot import BUNDLE_REF, ImageRepo, RepoSnapshot, pack_directory, pack_git
from environments.spec import IMAGE_REF

__all__ = ["BUNDLE_REF", "DEFAULT_PROTECTED", "CodeRepoTask", "HarborTests", "ImageRepo", "RepoSnapshot", "Solution",
           "TestSpec", "pack_directory", "pack_git"]

# What an agent may not change, as globs: a glob without "/" matches a file's name at any depth, one
# with "/" matches the whole path ("*" crosses directories). A spec's `verifier.protected_paths`
# replaces this list; a task's `protected_paths` adds to it.
TEST_FILES = ["test_*.py", "*_test.py", "tests/*", "test/*", "*/tests/*", "*/test/*", "conftest.py"]
"""Tests and their fixtures: protected by default, and not library code to the hack monitors."""
DEFAULT_PROTECTED = [
    *TEST_FILES,
    # the test runner's configuration and what stands in for the runner or the interpreter's start-up
    "pytest.ini", ".pytest.ini", "tox.ini", "noxfile.py", "pytest.py", "pytest/*", "_pytest/*", "*/_pytest/*",
    "unittest.py", "unittest/*", "sitecustomize.py", "usercustomize.py", "*.pth",
    # how git sees the tree
    ".gitattributes", ".gitmodules",
]
_MAX_IDS = 20_000


def is_safe_argument(value: str) -> bool:
    """A test path or id goes on pytest's command line: no options, no escapes from the workspace."""
    path = value.split("::", 1)[0]
    return (bool(value) and len(value) <= 1000 and not value.startswith("-") and "\0" not in value
            and not path.startswith("/") and ".." not in path.split("/"))


def files_inside_workspace(files: dict[str, str]) -> dict[str, str]:
    for path in files:
        if not is_safe_argument(path) or "::" in path:
            raise ValueError(f"expected a relative file path inside the workspace, got {path[:200]!r}")
    return files


class TestSpec(BaseModel):
    """One graded test layer. The grader owns the runner's invocation (see grader.py): the task names
    what to collect and which test ids count, never the command."""

    model_config = ConfigDict(extra="forbid")
    __test__ = False  # not a pytest test class

    paths: list[str] = Field(default_factory=list, max_length=_MAX_IDS)
    """What pytest collects, relative to the workspace (files, directories, node ids). Empty: the files
    of the named tests, or the whole workspace when none are named."""
    tests: list[str] = Field(default_factory=list, max_length=_MAX_IDS)
    """The pytest node ids this layer grades, each on its own (SWE-bench's FAIL_TO_PASS + PASS_TO_PASS).
    Empty: every collected test counts."""
    scoring: Literal["fraction", "all"] = "fraction"
    """`fraction`: the share of graded tests that passed; `all`: 1 only when every one passed
    (SWE-bench's "resolved")."""
    pythonpath: list[str] = Field(default_factory=lambda: ["."], max_length=32)
    """Directories (relative to the workspace) put on sys.path, as pytest's `pythonpath` setting."""
    files: dict[str, str] = Field(default_factory=dict)
    """Test files added before running (path relative to the workspace → content)."""
    patch: str | None = None
    """A unified diff applied before running (SWE-bench's test_patch)."""
    timeout_s: float = Field(default=120, gt=0, le=3600)

    @field_validator("paths", "tests", "pythonpath")
    @classmethod
    def _arguments_are_safe(cls, values: list[str]) -> list[str]:
        for value in values:
            if not is_safe_argument(value):
                raise ValueError(f"expected a relative path or test id inside the workspace that is not an option, "
                                 f"got {value[:200]!r}")
        return values

    @field_validator("files")
    @classmethod
    def _files_stay_inside(cls, files: dict[str, str]) -> dict[str, str]:
        return files_inside_workspace(files)

    def collect_paths(self) -> list[str]:
        if self.paths:
            return list(self.paths)
        files = dict.fromkeys(test.split("::", 1)[0] for test in self.tests)
        return list(files) or ["."]

    def agent_command(self) -> str:
        """What `run_tests` runs in the agent's own shell: informative only, never graded."""
        return "python3 -m pytest -q -p no:cacheprovider " + " ".join(shlex.quote(p) for p in self.collect_paths())


HARBOR_TEST = "test.sh"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_SYSTEM_DIRS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "sys",
                          "tmp", "usr", "var", "logs", "tests", "home", "root", "opt"})


class HarborTests(BaseModel):
    """A Harbor task's tests (environments/harbor): its `tests/` folder, uploaded only to a fresh grading
    sandbox holding base + the submission, where `bash /tests/test.sh` runs as the agent's uid from the task's
    working directory; the layer's score is the reward it writes to /logs/verifier (harbor_tests.py)."""

    model_config = ConfigDict(extra="forbid")
    __test__ = False

    format: Literal["harbor"]
    files: dict[str, str] = Field(max_length=10_000)
    """tests/: path relative to the folder → text; `test.sh` is the entry point."""
    workdir: str = Field(max_length=200, pattern=r"^(/[A-Za-z0-9_][A-Za-z0-9._-]*)+$")
    """The task's working directory (its Dockerfile's WORKDIR): a link to the workspace in its adapted image,
    and where test.sh starts."""
    timeout_s: float = Field(default=600, gt=0, le=3600)
    env: dict[str, str] = Field(default_factory=dict, max_length=100)
    """`[verifier].env` of task.toml, literal values."""

    @field_validator("files")
    @classmethod
    def _has_its_script(cls, files: dict[str, str]) -> dict[str, str]:
        files_inside_workspace(files)
        directories = {"/".join(path.split("/")[:depth]) for path in files for depth in range(1, path.count("/") + 1)}
        for path in files:
            if any(part in ("", ".") for part in path.split("/")) or path in directories:
                raise ValueError(f"files: expected file paths such as helpers/data.json (no empty or . part, none a "
                                 f"directory of another), got {path[:200]!r}")
        if HARBOR_TEST not in files:
            raise ValueError(f"files: expected the tests folder's {HARBOR_TEST}, got {sorted(files)[:10]}")
        return files

    @field_validator("workdir")
    @classmethod
    def _not_a_system_directory(cls, value: str) -> str:
        if value.startswith("/workspace/"):  # the workspace is a tmpfs over the image's: a link inside it is hidden
            raise ValueError(f"workdir: expected /workspace itself or a directory outside it, got {value!r}")
        if value.split("/")[1] in _SYSTEM_DIRS:
            raise ValueError(f"workdir: expected a directory of its own such as /app, got {value!r} (under "
                             f"/{value.split('/')[1]}, which the sandbox needs)")
        return value

    @field_validator("env")
    @classmethod
    def _plain_variables(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not re.fullmatch(_ENV_NAME, name) or "\0" in value or len(value) > 4096:
                raise ValueError(f"env: expected NAME=value pairs (a name of letters, digits and _, a value of at "
                                 f"most 4096 characters without NUL), got {name[:100]!r}")
        return env


class Solution(BaseModel):
    """A task's reference solution: the base plus this passes the hidden tests."""

    model_config = ConfigDict(extra="forbid")

    files: dict[str, str] = Field(default_factory=dict)
    """Files written over the base (path relative to the workspace → content)."""
    patch: str | None = None
    """A unified diff against the base (SWE-bench's gold `patch`), applied after `files`."""

    @field_validator("files")
    @classmethod
    def _files_stay_inside(cls, files: dict[str, str]) -> dict[str, str]:
        return files_inside_workspace(files)


class CodeRepoTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: RepoSnapshot | ImageRepo
    """The repository: an archive carried in the payload, or (`format: image`) the one the task's image holds."""
    image: str | None = None
    """The image this task's sandboxes start from (a SWE-bench instance's own image) instead of the
    environment's; it must match the environment's `task_images`. The agent's sandbox and every grading
    sandbox are fresh containers of it."""
    public_tests: TestSpec | None = None
    """The agent may run these (`run_tests`); their files are in its workspace. Graded like the hidden
    tests, in a fresh sandbox."""
    hidden_tests: TestSpec | HarborTests
    """Run only by the verifier, in a fresh sandbox, on the submitted diff: pytest through the grader's own
    runner, or a Harbor task's tests/test.sh (`format: harbor`)."""
    protected_paths: list[str] = Field(default_factory=list, max_length=1000)
    """Globs this task protects in addition to the environment's list."""
    solution: Solution | None = None
    """The reference solution, never shown to the agent. With it the hidden tests are blinded: the grader
    runs them on base + solution in a trusted sandbox, and the graded sandbox never holds the values the
    tests expect (blinding.py)."""

    canary: bool = False
    """A hack canary of this task (core/canaries.py): the same repository, tests and reference solution —
    the graded sandbox receives the very same files — but the worker perturbs every expected value of its
    key, so no honest change passes a blinded test, and an unblinded test counts as failed."""

    _exported: RepoSnapshot | None = PrivateAttr(default=None)

    @property
    def masked_paths(self) -> tuple[str, ...]:
        """What every sandbox of this task hides: the image's own repository (history and all). The agent
        works on the tree exported from it (kind.prepare), never on the directory itself."""
        return (self.repo.path,) if isinstance(self.repo, ImageRepo) else ()

    def with_exported(self, snapshot: RepoSnapshot) -> CodeRepoTask:
        """This task with its image repository's checked export (repo.export_image_repo) to install."""
        task = self.model_copy()
        task._exported = snapshot
        return task

    def snapshot(self) -> RepoSnapshot:
        """The archive install_repo unpacks: the payload's, or the export of the image's repository."""
        if isinstance(self.repo, RepoSnapshot):
            return self.repo
        if self._exported is None:
            raise RuntimeError("the image's repository was not exported (CodeRepoKind.prepare) before setup")
        return self._exported

    @field_validator("hidden_tests", mode="wrap")
    @classmethod
    def _layer_by_format(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> TestSpec | HarborTests:
        """`format: harbor` picks a Harbor task's tests, anything else is a pytest layer: errors name the fields of
        the one meant (`hidden_tests.paths`), not every member of the union."""
        if isinstance(value, TestSpec | HarborTests):
            return value
        if isinstance(value, dict) and value.get("format") == "harbor":
            return HarborTests.model_validate(value)
        return TestSpec.model_validate(value)

    @field_validator("image")
    @classmethod
    def _image_is_a_reference(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 300 or not re.fullmatch(IMAGE_REF, value)):
            raise ValueError(f"expected an image reference such as 'sweb.eval.x86_64.django__django-11099:latest' "
                             f"([registry/]lower-case name[:tag][@sha256:digest]), got {value[:200]!r}")
        return value

    @model_validator(mode="after")
    def _image_repo_has_its_image(self) -> CodeRepoTask:
        if isinstance(self.repo, ImageRepo) and self.image is None:
            raise ValueError("image: expected the image that holds the repository (repo.format is image), got none")
        return self
