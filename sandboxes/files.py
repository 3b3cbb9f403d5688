"""Files in and out of a sandbox as tar streams (repos, patches, artifacts).

Docker's own archive endpoint (put_archive/get_archive) cannot be used here: it refuses a read-only
root filesystem ("container rootfs is marked read-only") and does not see tmpfs mounts, which is
where every writable path of a sandbox lives. So the same tar stream goes through an attached
`tar -x` / `tar -c` exec instead, run as the sandbox user (it can only write where the agent can).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING

from core.tar import pack_files
from sandboxes.errors import SandboxError

if TYPE_CHECKING:
    from sandboxes.sandbox import Sandbox

TRANSFER_TIMEOUT_S = 300.0


def put_archive(sandbox: Sandbox, data: bytes, *, dest: str) -> None:
    """Extract tar bytes into `dest` inside the sandbox (created if missing)."""
    script = 'mkdir -p -- "$1" && exec tar -x --no-same-owner -m -C "$1" -f -'
    result = sandbox.exec(["sh", "-c", script, "put", dest], stdin=data, timeout_s=TRANSFER_TIMEOUT_S)
    if result.exit_code != 0:
        raise SandboxError(f"put {dest}: expected tar to extract, got exit {result.exit_code}: {_text(result)}")


def put_files(sandbox: Sandbox, files: Mapping[str, bytes], *, dest: str) -> None:
    """Write {path: content}; relative paths are under `dest`, absolute paths are used as given."""
    uid, gid = (int(x) for x in sandbox.spec.user.split(":"))
    rooted = {posixpath.normpath(posixpath.join(dest, path)): data for path, data in files.items()}
    for path in rooted:
        if not path.startswith("/") or path == "/":
            raise SandboxError(f"put_files: expected file paths, got {path!r}")
    put_archive(sandbox, pack_files(rooted, uid=uid, gid=gid), dest="/")


def get_archive(sandbox: Sandbox, path: str) -> bytes:
    """A tar of `path` (file or directory) stored under its base name."""
    parent, name = posixpath.split(posixpath.normpath(path))
    command = f"exec tar -c -C {shlex.quote(parent or '/')} -f - -- {shlex.quote(name or '.')}"
    result = sandbox.exec(["sh", "-c", command], timeout_s=TRANSFER_TIMEOUT_S)
    if result.exit_code != 0:
        raise SandboxError(f"get {path}: expected a file or directory, got exit {result.exit_code}: {_text(result)}")
    return result.output


def get_file(sandbox: Sandbox, path: str) -> bytes:
    """The bytes of one file."""
    result = sandbox.exec(["cat", "--", path], timeout_s=TRANSFER_TIMEOUT_S)
    if result.exit_code != 0:
        raise SandboxError(f"get {path}: expected a readable file, got exit {result.exit_code}: {_text(result)}")
    return result.output


def _text(result: object) -> str:
    output = getattr(result, "output", b"") + getattr(result, "stderr", b"")
    return output.decode(errors="replace").strip()[-300:]
