"""The payload of a code_repo task, and how a repository snapshot is packed into it."""

from __future__ import annotations

import base64
import io
import subprocess
import tarfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.errors import ConfigError

BUNDLE_REF = "refs/crucible/base"
DEFAULT_PROTECTED = ["tests/*", "test/*", "*/tests/*", "test_*.py", "*/test_*.py", "*_test.py", "conftest.py", "*/conftest.py"]


class RepoSnapshot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["tar", "git_bundle"]
    data_b64: str
    """The tarball (of a directory) or `git bundle` (with HEAD at the base commit), base64."""

    @property
    def data(self) -> bytes:
        return base64.b64decode(self.data_b64)


class TestSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str
    """Run from the workspace root; exit code 0 means every test passed."""
    files: dict[str, str] = Field(default_factory=dict)
    """Test files added before running (path relative to the workspace → content)."""
    patch: str | None = None
    """A unified diff applied before running (SWE-bench's test_patch)."""
    timeout_s: float = Field(default=120, gt=0)


class CodeRepoTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: RepoSnapshot
    public_tests: TestSpec | None = None
    """The agent may run these (`run_tests`); their files are in its workspace."""
    hidden_tests: TestSpec
    """Run only by the verifier, in a fresh sandbox, on the submitted diff."""
    protected_paths: list[str] = Field(default_factory=lambda: list(DEFAULT_PROTECTED))
    """Globs the agent must not change (test files); an edit there fails the rule layer."""


def pack_directory(path: Path) -> RepoSnapshot:
    """Tar a directory (without its .git) into a snapshot."""
    if not path.is_dir():
        raise ConfigError(f"repo: expected a directory, got {str(path)!r}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in sorted(path.rglob("*")):
            relative = child.relative_to(path)
            if ".git" in relative.parts or "__pycache__" in relative.parts:
                continue
            tar.add(child, arcname=str(relative), recursive=False)
    return RepoSnapshot(format="tar", data_b64=base64.b64encode(buffer.getvalue()).decode())


def pack_git(repo: Path, *, commit: str) -> RepoSnapshot:
    """Bundle a local git repository at `commit` (history up to it, HEAD pointing at it)."""
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        raise ConfigError(f"repo: expected a git repository, got {str(repo)!r}")
    git = ["git", "-C", str(repo)]
    try:
        sha = subprocess.run([*git, "rev-parse", "--verify", f"{commit}^{{commit}}"],
                             check=True, capture_output=True, text=True).stdout.strip()
        # A bundle carries refs, not bare commits: name the base commit under a ref of our own.
        subprocess.run([*git, "update-ref", BUNDLE_REF, sha], check=True, capture_output=True)
        bundle = subprocess.run([*git, "bundle", "create", "-", BUNDLE_REF], check=True, capture_output=True).stdout
    except subprocess.CalledProcessError as error:
        stderr = error.stderr if isinstance(error.stderr, str) else error.stderr.decode(errors="replace")
        raise ConfigError(f"repo {repo}: cannot bundle commit {commit!r}: {stderr.strip()}") from None
    finally:
        subprocess.run([*git, "update-ref", "-d", BUNDLE_REF], capture_output=True)
    return RepoSnapshot(format="git_bundle", data_b64=base64.b64encode(bundle).decode())
