"""The `harbor` package, run where it can run: an image of Debian 13 (Python 3.13) with harbor's wheels.

    read_tasks([Path("tasks/hello-world")])   # -> [HarborRead(...)], each parsed by harbor.models.task.Task

The reader image is content-hashed (READER_ROOT's inputs, then every wheel installed), built once. Each read
starts one container of it: no network, read-only root, no capability, the nobody uid, each folder mounted
read-only; sandbox/read_tasks.py prints one JSON object per folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from core.errors import ConfigError, CrucibleError
from environments.images.build import IMPORT_CHANGES, DebianRoot, build_root
from environments.images.packages import wheel_image
from sandboxes.docker_client import docker_api

HARBOR = "harbor==0.25.0"
PYTHON = (3, 13)
READER_ROOT = DebianRoot(
    repository="crucible-harbor/python", suite="trixie", packages=("python3",),
    setup="set -e\nrm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/* /var/log/*.log\n",
    changes=tuple(change for change in IMPORT_CHANGES if not change.startswith("ENV GIT_")),
)
"""Debian 13 (trixie), whose python3 is 3.13: harbor requires 3.12 or newer."""
SCRIPT = (Path(__file__).resolve().parent / "sandbox" / "read_tasks.py").read_text()
MAX_TASKS = 1000
MAX_OUTPUT = 256 << 20
READ_DEADLINE_S = 300.0
NOBODY = "65534:65534"


class ReaderError(CrucibleError):
    """The reader container failed (not a folder's fault: harbor's refusals are ConfigErrors naming the folder)."""


@dataclass(frozen=True)
class HarborRead:
    """One folder as harbor read it."""

    folder: Path
    name: str
    instruction: str
    config: dict[str, Any]
    """harbor's TaskConfig, dumped as JSON."""
    tests: dict[str, str]
    """tests/: relative path -> text."""
    solution: dict[str, str]
    """solution/: relative path -> text."""
    harbor_version: str


def reader_image(*, cache_dir: Path | None = None) -> str:
    """The reader image's tag (built if missing: debootstrap of Debian 13, then harbor's wheels)."""
    if cache_dir is None:
        from core.settings import get_settings

        cache_dir = get_settings().data_dir / "images"
    cache_dir.mkdir(parents=True, exist_ok=True)
    base = build_root(READER_ROOT, api=docker_api(), cache_dir=cache_dir)
    return wheel_image(base.tag, repository="crucible-harbor", name="reader", requirements=[HARBOR], python=PYTHON)


def read_tasks(folders: list[Path], *, image: str | None = None) -> list[HarborRead]:
    """Each folder read by harbor's own task model (harbor.models.task.Task). ConfigError naming the folder
    and harbor's words when one is not a Harbor task."""
    if not folders:
        raise ConfigError("DIR: expected at least one Harbor task folder, got none")
    if len(folders) > MAX_TASKS:
        raise ConfigError(f"DIR: expected at most {MAX_TASKS} Harbor task folders at once, got {len(folders)}")
    resolved = []
    for folder in folders:
        path = folder.expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(f"{folder}: expected a Harbor task folder (instruction.md, task.toml, tests/), "
                              "got no such directory")
        resolved.append(path)
    documents = _run_reader(resolved, image=image or reader_image())
    reads = []
    for index, (folder, document) in enumerate(zip(resolved, documents, strict=True)):
        if "error" in document:
            words = str(document["error"]).replace(f"/tasks/{index}/{folder.name}", str(folder))
            raise ConfigError(f"{folder}: expected a Harbor task folder, got harbor's error: {words}")
        reads.append(HarborRead(folder=folder, name=document["name"], instruction=document["instruction"],
                                config=document["config"], tests=document["tests"], solution=document["solution"],
                                harbor_version=document["harbor_version"]))
    return reads


def _run_reader(folders: list[Path], *, image: str) -> list[dict[str, Any]]:
    api = docker_api()
    mounts = [f"/tasks/{index}/{folder.name}" for index, folder in enumerate(folders)]  # harbor names a task by its folder
    container = api.create_container(
        image, command=["python3", "-I", "-c", SCRIPT, *mounts], user=NOBODY, working_dir="/",
        network_disabled=True, labels={"crucible.role": "harbor-reader"},
        host_config=api.create_host_config(
            binds={str(folder): {"bind": mount, "mode": "ro"} for folder, mount in zip(folders, mounts, strict=True)},
            network_mode="none", read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"],
            mem_limit=1 << 30, memswap_limit=1 << 30, pids_limit=64, tmpfs={"/tmp": "size=64m"},
        ),
    )
    try:
        api.start(container)
        try:
            status = api.wait(container, timeout=READ_DEADLINE_S)
        except requests.exceptions.RequestException:  # the client's read timed out: the reader is stuck
            raise ReaderError(f"harbor's reader: expected it to finish within {READ_DEADLINE_S:g} s, it did "
                              "not") from None
        output = api.logs(container, stdout=True, stderr=False)
        errors = api.logs(container, stdout=False, stderr=True).decode(errors="replace")
    finally:
        api.remove_container(container, force=True)
    if status.get("StatusCode") != 0 or len(output) > MAX_OUTPUT:
        raise ReaderError(f"harbor's reader: expected exit 0, got {status.get('StatusCode')}: {errors[-800:]}")
    documents = [json.loads(line) for line in output.splitlines() if line.strip()]
    if len(documents) != len(folders):
        raise ReaderError(f"harbor's reader: expected {len(folders)} documents, got {len(documents)}: {errors[-400:]}")
    return documents
