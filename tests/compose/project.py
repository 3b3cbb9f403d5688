"""compose.yaml run for real: the images it names, built here, and a compose project driven by Debian's
docker-compose 1.29 (the `docker-compose` command).

The public images the file names (postgres, redis, and the python base of the repo's Dockerfile) cannot be
pulled on these machines: `standin_images` builds stand-ins from Debian's packages (tests/compose/standins,
on the sandbox images' debootstrap base, by content hash: a second build is a no-op) and the test names them
through the file's variables, which keep the public defaults. `crucible_image` builds the repo's Dockerfile
on a stand-in base, without vLLM (the file's GPU services are not started here), from a wheelhouse (the
Dockerfile's CRUCIBLE_WHEELS, served to the build on loopback): pip inside a build has no route to PyPI here
(the machine's TLS authority is not in the image, and a build mounts nothing), so the wheels are made by pip
in a container of the same base with that authority and the machine's wheel folder mounted (the CPU build
of torch).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from environments.images.build import build_images
from sandboxes.docker_client import docker_api
from sandboxes.errors import ImageBuildError

ROOT = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parent / "standins"
STANDIN_FOR = {"compose-postgres": "CRUCIBLE_POSTGRES_IMAGE", "compose-redis": "CRUCIBLE_REDIS_IMAGE",
               "compose-python": "CRUCIBLE_PYTHON_IMAGE"}
"""Each stand-in (a folder of tests/compose/standins) and the variable of compose.yaml it is named by."""


def standin_images(cache_dir: Path) -> dict[str, str]:
    """{variable: tag} for every stand-in, built when its tag is missing."""
    built = build_images(names=sorted(STANDIN_FOR), images_dir=STANDINS, data_dir=cache_dir)
    return {STANDIN_FOR[image.name]: image.tag for image in built if image.name in STANDIN_FOR}


def _image_inputs() -> list[Path]:
    """The files the Dockerfile's context holds (.dockerignore's allow-list), sorted."""
    allowed = [line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    files: list[Path] = []
    for name in allowed:
        path = ROOT / name
        files += [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()
                                                   and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted(files)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # one line a wheel is noise
        pass


@contextmanager
def _served(folder: Path) -> Iterator[str]:
    """`folder` served read-only over HTTP on loopback (a build on the host network reaches it)."""
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def wheelhouse(python_image: str, *, cache_dir: Path) -> Path:
    """Wheels of the project's dependencies and build requirements for `python_image`'s Python, made by pip
    in a container of that image (its interpreter decides the markers: Debian's 3.11.2 needs wheels the
    host's 3.11 does not) with this machine's TLS authority and wheel folder mounted; once per inputs."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = [*project["build-system"]["requires"], "wheel", *project["project"]["dependencies"]]
    key = hashlib.sha256(json.dumps([python_image, wanted]).encode()).hexdigest()[:12]
    folder = cache_dir / f"wheelhouse-{key}"
    if (folder / ".complete").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    mounts, env = ["-v", f"{folder}:/wheels"], []
    if os.environ.get("PIP_CERT"):
        mounts += ["-v", f"{os.environ['PIP_CERT']}:/run/host-ca.crt:ro"]
        env += ["-e", "PIP_CERT=/run/host-ca.crt"]
    if os.environ.get("PIP_FIND_LINKS") and Path(os.environ["PIP_FIND_LINKS"]).is_dir():
        mounts += ["-v", f"{os.environ['PIP_FIND_LINKS']}:/run/find-links:ro"]
        env += ["-e", "PIP_FIND_LINKS=/run/find-links"]
    done = subprocess.run(["docker", "run", "--rm", "--network", "host", *mounts, *env, python_image,
                           "pip", "wheel", "--quiet", "--use-pep517", "--wheel-dir", "/wheels", *wanted],
                          capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise ImageBuildError(f"pip wheel: expected exit 0, got {done.returncode}:\n{done.stderr[-3000:]}")
    (folder / ".complete").touch()
    return folder


def crucible_image(python_image: str, *, cache_dir: Path) -> str:
    """The repo's Dockerfile built on `python_image` with no extras; tagged by its inputs' hash."""
    digest = hashlib.sha256(python_image.encode())
    for path in [ROOT / "Dockerfile", ROOT / ".dockerignore", *_image_inputs()]:
        digest.update(f"{path.relative_to(ROOT)}\n".encode() + hashlib.sha256(path.read_bytes()).digest())
    tag = f"crucible-compose-test:{digest.hexdigest()[:12]}"
    api = docker_api(timeout_s=1800)
    if api.images(name=tag, quiet=True):
        return tag
    with _served(wheelhouse(python_image, cache_dir=cache_dir)) as wheels_url:
        lines: list[str] = []
        args = {"PYTHON_IMAGE": python_image, "CRUCIBLE_EXTRAS": "", "CRUCIBLE_WHEELS": wheels_url}
        for chunk in api.build(path=str(ROOT), tag=tag, buildargs=args, network_mode="host", rm=True, forcerm=True,
                               pull=False, decode=True):
            if "error" in chunk:
                raise ImageBuildError(f"docker build {tag}: {chunk['error'].strip()}\n" + "".join(lines[-30:]))
            lines.append(str(chunk.get("stream", "")))
    return tag


@dataclass
class Project:
    """One compose project: compose.yaml (plus `extra` files) under its own name, with `variables`."""

    name: str
    variables: dict[str, str]
    extra: list[Path] = field(default_factory=list)

    def command(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        done = self._run(args, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
                                 f"\n{self.logs()}")
        return done

    def logs(self) -> str:
        return self._run(("logs", "--no-color", "--tail", "60"), timeout=120).stdout[-12000:]

    def _run(self, args: tuple[str, ...], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """`docker-compose ARGS` on this project's files, with its variables and none of the caller's CRUCIBLE_*."""
        files = [arg for path in [ROOT / "compose.yaml", *self.extra] for arg in ("-f", str(path))]
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}, **self.variables}
        return subprocess.run(["docker-compose", "--project-directory", str(ROOT), "-p", self.name, *files, *args],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)

    def config(self) -> dict:
        return _yaml(self.command("config").stdout)

    def containers(self, service: str | None = None) -> list[str]:
        """The ids of the project's containers (of one service), running or not."""
        filters = [f"label=com.docker.compose.project={self.name}"]
        if service:
            filters.append(f"label=com.docker.compose.service={service}")
        done = subprocess.run(["docker", "ps", "-aq", "--no-trunc", *[a for f in filters for a in ("--filter", f)]],
                              capture_output=True, text=True, check=True)
        return done.stdout.split()


def _yaml(text: str) -> dict:
    import yaml

    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict), text
    return loaded
