"""Tar streams on this machine: packing files and directories, extracting one safely. The one tar helper:
sandboxes (files in and out of a container), the grader (hidden tests) and the CLI (`crucible sandbox
cp`) use it."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

from core.errors import NotFound


def pack_files(files: Mapping[str, bytes], *, uid: int, gid: int) -> bytes:
    """A tar of {path relative to the extraction root: content}, owned by uid:gid, mode 0644."""
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o644, now, uid, gid
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pack_path(source: Path, *, arcname: str | None = None) -> bytes:
    """A tar of a local file or directory (recursively), stored under `arcname` (default: its name)."""
    if not source.exists():
        raise NotFound(f"copy: expected an existing local path, got {str(source)!r}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(source), arcname=arcname or source.name)
    return buf.getvalue()


def extract_to(data: bytes, destination: Path) -> list[str]:
    """Extract a tar into a local directory safely (no absolute paths, links out, devices)."""
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        names = tar.getnames()
        tar.extractall(destination, filter="data")
    return names
