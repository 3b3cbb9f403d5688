"""A real registry for tests: Debian's `docker-registry` (the distribution v2 server), on an address of the
test's choosing, its storage in a directory that several of them may share (one for the engine that
pushes, on loopback, where every engine trusts plain HTTP; one on a bridge address for other hosts)."""

from __future__ import annotations

import io
import secrets
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from core.net import free_port
from sandboxes.docker_client import docker_api


@contextmanager
def serve_registry(storage: Path, *, host: str = "127.0.0.1", port: int | None = None,
                   popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen) -> Iterator[str]:
    """A registry on host:port (a free port by default), storing under `storage`; its `host:port`. `popen`
    starts it (a fleet host's, to run it in that host's namespace)."""
    port = port or free_port()
    config = storage.parent / f"registry-{host}-{port}.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n"
                      f"http:\n  addr: {host}:{port}\n")
    server = popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60  # a bound on waiting, not a timing claim
        while True:
            try:
                if httpx.get(f"http://{host}:{port}/v2/", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, server.stderr.read().decode()[-2000:] if server.stderr else ""
            assert time.monotonic() < deadline, f"the registry on {host}:{port} did not answer /v2/"
            time.sleep(0.1)
        yield f"{host}:{port}"
    finally:
        server.terminate()
        server.wait(30)


@contextmanager
def tiny_image(repository: str) -> Iterator[str]:
    """An image of one small file (`docker import` on this machine's engine), tagged repository:<random>:
    pushed and pulled in a moment, never run. Removed after."""
    api = docker_api()
    tag = secrets.token_hex(6)
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        content = f"tiny {tag}\n".encode()
        member = tarfile.TarInfo("tiny.txt")
        member.size = len(content)
        archive.addfile(member, io.BytesIO(content))
    api.import_image_from_data(data.getvalue(), repository=repository, tag=tag)
    try:
        yield f"{repository}:{tag}"
    finally:
        for image in api.images(name=repository):
            if any(name.endswith(f":{tag}") for name in image.get("RepoTags") or []):
                api.remove_image(image["Id"], force=True)
