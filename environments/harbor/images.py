"""A Harbor task's image, as Crucible's sandboxes run it.

    environment = environment_image(read)                       # task.toml's docker_image, or environment/ built
    workdir = workdir_of(read, environment)                      # [environment].workdir, else the image's WORKDIR
    image = adapted_image(environment, workdir=workdir)          # crucible-harbor/<name>:<hash>
    snapshot = export_workdir(environment, workdir)              # the workspace the agent starts from

Harbor's `environment/Dockerfile` is built here with no network and nothing pulled: its FROM must be an image this
engine holds (the operator's, or a named local one with `--image`). The adapted image is it with three links
added, because Crucible's sandboxes have a read-only root and writable tmpfs mounts only: the working directory
(where Harbor's instruction and tests name their files, e.g. /app) leads to the workspace, /tests and /logs into
/tmp/crucible-harbor, which the grader fills in a fresh sandbox only (environments/code_repo/harbor_tests.py).
The working directory's own files become the task's repository (the agent's workspace, committed as the base).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
from pathlib import Path

import docker
from docker.errors import NotFound

from core.errors import ConfigError
from environments.code_repo.snapshot import MAX_UNPACKED_BYTES
from environments.code_repo.task import HarborTests, RepoSnapshot, pack_directory
from environments.harbor.reader import HarborRead
from environments.images.build import _image_exists
from environments.images.packages import _repository_name
from sandboxes.docker_client import docker_api
from sandboxes.errors import ImageBuildError

REPOSITORY = "crucible-harbor"
"""Where adapted task images are tagged: an environment's `task_images` allows `crucible-harbor/*` to play them."""
ENVIRONMENT_REPOSITORY = "crucible-harbor-env"
BUILD_DEADLINE_S = 1800
BUILD_MEMORY = 4 << 30
"""What one RUN step of a task's Dockerfile may use."""
SCRATCH = "/tmp/crucible-harbor"
ADAPT = """FROM {base}
USER root
RUN set -e; \\
    for tool in bash git python3 setpriv tar getent; do \\
      command -v "$tool" >/dev/null || {{ echo "the image lacks $tool: Crucible's sandboxes need bash, git, python3, \\
setpriv (util-linux), tar and a user of uid 1000 (base the task's Dockerfile on an image that has them)" >&2; exit 3; }}; \\
    done; \\
    getent passwd 1000 >/dev/null || {{ echo "the image has no user of uid 1000, the sandboxes' agent" >&2; exit 3; }}; \\
    mkdir -p /workspace /run/crucible /run/crucible-out /run/crucible-pristine /run/crucible-keeper; \\
    {link_workdir} \\
    rm -rf /tests /logs; ln -s {scratch}/tests /tests; ln -s {scratch}/logs /logs
WORKDIR /workspace
LABEL crucible.harbor.workdir="{workdir}"
"""


def environment_image(read: HarborRead, *, image: str | None = None) -> str:
    """The image of the task's environment: `image` (a local image the operator names), task.toml's
    `[environment].docker_image` (it must be on this engine), else `environment/Dockerfile` built here
    (`crucible-harbor-env/<name>:<hash of the folder>`, a no-op when built)."""
    api = docker_api()
    named = image or read.config.get("environment", {}).get("docker_image")
    if named:
        if not _image_exists(api, named):
            raise ConfigError(f"{read.folder}: image: expected an image on this engine, got {named!r} (nothing is "
                              "pulled: build or load it first)")
        return named
    context = read.folder / "environment"
    links = [path for path in [context, *context.rglob("*")] if path.is_symlink()] if context.exists() else []
    if links:  # a link would make the build's context, or a file hashed here, one outside the task
        raise ConfigError(f"{read.folder}: environment/: expected files and folders of the task's own, got a symbolic "
                          f"link: {links[0].relative_to(read.folder)}")
    if not (context / "Dockerfile").is_file():
        raise ConfigError(f"{read.folder}: expected environment/Dockerfile or [environment].docker_image, got neither")
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(context).as_posix()}\0{path.stat().st_mode & 0o111}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    tag = f"{ENVIRONMENT_REPOSITORY}/{_repository_name(read.name, default='task')}:{digest.hexdigest()[:12]}"
    if not _image_exists(api, tag):
        _build(api, context=context, tag=tag, what=f"{read.folder}: environment/Dockerfile")
    return tag


def _build(api: docker.APIClient, *, context: Path, tag: str, what: str) -> None:
    lines: list[str] = []
    for chunk in api.build(path=str(context), tag=tag, network_mode="none", pull=False, rm=True, forcerm=True,
                           decode=True, timeout=BUILD_DEADLINE_S, labels={"crucible.harbor": "1"},
                           container_limits={"memory": BUILD_MEMORY, "memswap": BUILD_MEMORY}):
        if "error" in chunk:
            raise ImageBuildError(f"{what}: docker build: {chunk['error'].strip()[:600]}\n" + "".join(lines[-10:]))
        lines.append(str(chunk.get("stream", "")))


def workdir_of(read: HarborRead, environment: str) -> str:
    """`[environment].workdir`, else the image's WORKDIR; checked as HarborTests checks it."""
    workdir = read.config.get("environment", {}).get("workdir") or \
        (docker_api().inspect_image(environment).get("Config") or {}).get("WorkingDir") or ""
    workdir = workdir.rstrip("/")
    try:
        HarborTests(format="harbor", files={"test.sh": ""}, workdir=workdir)
    except ValueError as error:
        raise ConfigError(f"{read.folder}: expected a working directory of the task's own (its Dockerfile's WORKDIR "
                          f"or [environment].workdir, such as /app), got {workdir or 'none'!r}: "
                          f"{str(error).splitlines()[-1][:200]}") from None
    return workdir


def adapted_image(environment: str, *, workdir: str) -> str:
    """`crucible-harbor/<name>:<hash>`: the environment's image with the links Crucible's sandboxes need (a
    no-op when built). ImageBuildError naming what the image lacks."""
    api = docker_api()
    link = "" if workdir == "/workspace" else \
        f'rm -rf {workdir}; mkdir -p "$(dirname {workdir})"; ln -s /workspace {workdir};'
    dockerfile = ADAPT.format(base=environment, link_workdir=link, scratch=SCRATCH, workdir=workdir)
    image_id = api.inspect_image(environment)["Id"]
    digest = hashlib.sha256(f"{image_id}\n{dockerfile}".encode()).hexdigest()[:12]
    name = _repository_name(environment.rsplit(":", 1)[0].rsplit("/", 1)[-1], default="task")
    tag = f"{REPOSITORY}/{name}:{digest}"
    if not _image_exists(api, tag):
        with tempfile.TemporaryDirectory(prefix="crucible-harbor-adapt-") as directory:
            (Path(directory) / "Dockerfile").write_text(dockerfile)
            _build(api, context=Path(directory), tag=tag, what=f"adapting {environment}")
    return tag


def export_workdir(environment: str, workdir: str) -> RepoSnapshot:
    """The working directory's files in the environment's image (never run: read from a created container), as
    the task's checked repository snapshot."""
    api = docker_api()
    container = api.create_container(environment, command=["true"], network_disabled=True,
                                     labels={"crucible.role": "harbor-export"})
    data = bytearray()
    try:
        try:
            stream, _ = api.get_archive(container, f"{workdir}/.")
        except NotFound:  # an image without the directory: the workspace starts empty
            stream = iter(())
        for chunk in stream:  # read with a cap: the image is the task author's
            data += chunk
            if len(data) > MAX_UNPACKED_BYTES + (1 << 20):
                raise ConfigError(f"image {environment}: {workdir}: expected at most {MAX_UNPACKED_BYTES >> 20} MiB "
                                  "of files, got more")
    finally:
        api.remove_container(container, force=True, v=True)
    with tempfile.TemporaryDirectory(prefix="crucible-harbor-workdir-") as directory:
        root = Path(directory)
        if data:
            try:
                with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
                    tar.extractall(root, filter="data")
            except tarfile.FilterError as error:
                raise ConfigError(f"image {environment}: {workdir}: expected files and directories of its own, "
                                  f"got {error}") from None
        return pack_directory(root)
