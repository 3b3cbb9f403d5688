"""A code_repo task's repository as data: a gzip tarball or a git bundle, packed on the client, checked
before it is stored.

    snapshot = pack_directory(Path("repos/calc"))             # CLI: a local directory → tar
    snapshot = pack_git(Path("~/src/django"), commit="3f2a…")  # CLI: a local repo → bundle (read-only)
    check_snapshot(snapshot, where="line 3: repo")            # server: refuse anything but a clean archive

The server never reads a path a request names: uploads carry these bytes. `check_snapshot` is what
makes bytes from a stranger safe to unpack in a sandbox: a tarball must be a real gzip tar whose every
member stays inside the workspace (no absolute paths, no `..`, no links out, no devices or fifos), and
a bundle a real git bundle carrying the one ref the sandbox fetches.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import posixpath
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.errors import ConfigError

BUNDLE_REF = "refs/crucible/base"
MAX_SNAPSHOT_BYTES = 48 * 2**20
"""A packed repository (compressed) larger than this is refused: it is stored in a JSONB payload."""
MAX_UNPACKED_BYTES = 1 * 2**30
"""What a tarball may unpack to (the sandbox workspace is a 1 GiB tmpfs by default)."""
MAX_MEMBERS = 50_000
"""Files (and directories) a tarball may hold: a 1.5 MB tar.gz of 250k empty members cost 5 s and 92 MB
to refuse at 200k; real task repositories hold hundreds to a few thousand."""
_BUNDLE_SIGNATURES = (b"# v2 git bundle\n", b"# v3 git bundle\n")
_GIT_SAFE = ["-c", "core.fsmonitor=false", "-c", "protocol.allow=never"]  # a hostile repo config runs nothing


class RepoSnapshot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["tar", "git_bundle"]
    data_b64: str
    """The tarball (of a directory) or `git bundle` (with HEAD at the base commit), base64."""

    @property
    def data(self) -> bytes:
        return base64.b64decode(self.data_b64)


class ImageRepo(BaseModel):
    """A repository the task's own image already holds (a SWE-bench instance image's /testbed), named by
    its base commit. Nothing is carried in the payload; at every setup the sandbox's copy is checked to
    hold nothing but the base and its history (repo.check_image_repo) before it is copied into the
    workspace."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["image"]
    path: str = Field(default="/testbed", max_length=200, pattern=r"^(/[A-Za-z0-9_][A-Za-z0-9._-]*)+$")
    """The repository's directory in the image (absolute, no `..`)."""
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    """The base commit's full id: HEAD must be it, and every object stored must be in its history."""


def check_snapshot(snapshot: RepoSnapshot, *, where: str = "repo") -> None:
    """ConfigError naming `where` unless the snapshot is an archive the sandbox may safely unpack."""
    if len(snapshot.data_b64) > MAX_SNAPSHOT_BYTES * 4 // 3 + 4:
        raise ConfigError(f"{where}: expected an archive of at most {MAX_SNAPSHOT_BYTES} bytes, "
                          f"got about {len(snapshot.data_b64) * 3 // 4}")
    try:
        data = base64.b64decode(snapshot.data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: data_b64: expected base64, got text that is not") from None
    if snapshot.format == "tar":
        _check_tarball(data, where=where)
    else:
        _check_bundle(data, where=where)


def _check_tarball(data: bytes, *, where: str) -> None:
    if not data.startswith(b"\x1f\x8b"):
        raise ConfigError(f"{where}: expected a gzip-compressed tar, got data that is not gzip")
    total = members = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:  # streamed: a bomb stops at the first member past the bound
                tar.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every member read; not needed
                members += 1
                total += max(member.size, 0)
                if members > MAX_MEMBERS or total > MAX_UNPACKED_BYTES:
                    raise ConfigError(f"{where}: expected at most {MAX_MEMBERS} files and {MAX_UNPACKED_BYTES} "
                                      f"bytes unpacked, got more")
                check_member(member, where=where)
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ConfigError(f"{where}: expected a readable gzip tar, got a broken one ({error})") from None


def _inside(path: str) -> bool:
    normal = posixpath.normpath(path)
    return not path.startswith("/") and normal != ".." and not normal.startswith("../")


def check_member(member: tarfile.TarInfo, *, where: str) -> None:
    name = member.name
    if "\x00" in name or not _inside(name):
        raise ConfigError(f"{where}: expected paths inside the repository, got {name[:200]!r}")
    if member.issym():
        target = posixpath.join(posixpath.dirname(name), member.linkname)
        if member.linkname.startswith("/") or not _inside(target):
            raise ConfigError(f"{where}: expected links that stay inside the repository, got {name[:200]!r} → "
                              f"{member.linkname[:200]!r}")
    elif member.islnk():
        if not _inside(member.linkname):
            raise ConfigError(f"{where}: expected hard links inside the repository, got {name[:200]!r} → "
                              f"{member.linkname[:200]!r}")
    elif not (member.isfile() or member.isdir()):
        kind = {tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device",
                tarfile.FIFOTYPE: "fifo"}.get(member.type, f"member of type {member.type!r}")
        raise ConfigError(f"{where}: expected files, directories and links, got a {kind} at {name[:200]!r}")


def _check_bundle(data: bytes, *, where: str) -> None:
    if not data.startswith(_BUNDLE_SIGNATURES):
        raise ConfigError(f"{where}: expected a git bundle (v2 or v3), got data that is not one")
    with tempfile.TemporaryDirectory(prefix="crucible-bundle-") as directory:
        path = Path(directory) / "repo.bundle"
        path.write_bytes(data)
        result = subprocess.run(["git", *_GIT_SAFE, "bundle", "list-heads", str(path)], capture_output=True,
                                text=True, cwd=directory, timeout=120, env=git_env())
    if result.returncode != 0:
        raise ConfigError(f"{where}: expected a readable git bundle, got a broken one "
                          f"({result.stderr.strip()[:200]})")
    heads = [line.split(" ", 1)[-1] for line in result.stdout.splitlines()]
    if BUNDLE_REF not in heads:
        raise ConfigError(f"{where}: expected a git bundle carrying {BUNDLE_REF}, got one with {heads[:5]}")


def git_env() -> dict[str, str]:
    # No user or system config: packing and checking must not depend on (or run) anyone's git config.
    return {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def pack_directory(path: Path) -> RepoSnapshot:
    """Tar a local directory (without its .git) into a checked snapshot. Client side: reads `path`."""
    if not path.is_dir():
        raise ConfigError(f"repo: expected a directory, got {str(path)!r}")
    children = [child for child in sorted(path.rglob("*"))
                if not {".git", "__pycache__"} & set(child.relative_to(path).parts)]
    unpacked = sum(child.lstat().st_size for child in children if child.is_file() and not child.is_symlink())
    if unpacked > MAX_UNPACKED_BYTES:
        raise ConfigError(f"repo {path}: expected at most {MAX_UNPACKED_BYTES} bytes of files, got {unpacked}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in children:
            tar.add(child, arcname=str(child.relative_to(path)), recursive=False)
    snapshot = RepoSnapshot(format="tar", data_b64=base64.b64encode(buffer.getvalue()).decode())
    check_snapshot(snapshot, where=f"repo {path}")
    return snapshot


def pack_tarball(path: Path) -> RepoSnapshot:
    """A local `.tar.gz` as a checked snapshot. Client side."""
    if path.stat().st_size > MAX_SNAPSHOT_BYTES:
        raise ConfigError(f"repo {path}: expected at most {MAX_SNAPSHOT_BYTES} bytes, got {path.stat().st_size}")
    snapshot = RepoSnapshot(format="tar", data_b64=base64.b64encode(path.read_bytes()).decode())
    check_snapshot(snapshot, where=f"repo {path}")
    return snapshot


def pack_git(repo: Path, *, commit: str) -> RepoSnapshot:
    """Bundle a local git repository at `commit` (its history, under BUNDLE_REF) without writing to it.

    A bundle carries refs, not bare commits, so the base commit needs a ref: it is made in a scratch
    repository that borrows `repo`'s objects (git alternates), never in `repo` itself.
    """
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        raise ConfigError(f"repo: expected a git repository, got {str(repo)!r}")
    try:
        sha = _git(repo, "rev-parse", "--verify", "--end-of-options", f"{commit}^{{commit}}").decode().strip()
        objects = _git(repo, "rev-parse", "--path-format=absolute", "--git-path", "objects").decode().strip()
        with tempfile.TemporaryDirectory(prefix="crucible-pack-") as scratch:
            _git(Path(scratch), "init", "-q", "--bare")
            (Path(scratch) / "objects" / "info" / "alternates").write_text(objects + "\n")
            _git(Path(scratch), "update-ref", BUNDLE_REF, sha)
            bundle = _git(Path(scratch), "bundle", "create", "-", BUNDLE_REF)
    except subprocess.CalledProcessError as error:
        stderr = error.stderr if isinstance(error.stderr, str) else error.stderr.decode(errors="replace")
        raise ConfigError(f"repo {repo}: cannot bundle commit {commit!r}: {stderr.strip()[:300]}") from None
    snapshot = RepoSnapshot(format="git_bundle", data_b64=base64.b64encode(bundle).decode())
    check_snapshot(snapshot, where=f"repo {repo}")
    return snapshot


def _git(directory: Path, *args: str) -> bytes:
    result = subprocess.run(["git", *_GIT_SAFE, "-C", str(directory), *args], check=True, capture_output=True,
                            env=git_env(), timeout=600)
    return result.stdout
