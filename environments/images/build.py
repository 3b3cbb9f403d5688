"""Build sandbox images without a registry: a debootstrap base + one Dockerfile per environment.

    crucible images build            # or: build_images()

* base: `debootstrap --variant=minbase bookworm` with python3, git, coreutils, procps, bash and a
  non-root user `agent` (uid 1000) with a home, then `docker import` -> `crucible/base:<hash>`. The
  rootfs tarball (and the downloaded .debs) are cached under `<data_dir>/images/`. With
  CRUCIBLE_SANDBOX_BASE_IMAGE set, that local image is the base instead.
* environments: every `environments/images/<name>/Dockerfile`, built with `BASE_IMAGE=<base tag>`
  on the host network -> `crucible/<name>:<hash>`. An image may take files from outside its folder,
  listed in its folder's `context.json` (the browser image takes the in-sandbox browser driver and the
  MiniWoB++ pages of the installed `miniwob` package); they are copied into the build context and
  hashed with it.

A tag's hash covers every input (debootstrap arguments and setup script; the base tag and every
file of the build context), so an unchanged image is never rebuilt: a second build is a no-op.
`crucible/<name>:latest` follows the newest build.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import docker
from docker.errors import APIError, NotFound

from sandboxes.docker_client import docker_api
from sandboxes.errors import ImageBuildError

log = logging.getLogger(__name__)

IMAGES_DIR = Path(__file__).resolve().parent
BUILDER_VERSION = "1"  # bump to force every image to rebuild
SUITE, VARIANT, MIRROR = "bookworm", "minbase", "http://deb.debian.org/debian"
PACKAGES = ("python3", "git", "coreutils", "procps", "bash", "patch", "ca-certificates")
SETUP_SCRIPT = """set -e
useradd --create-home --uid 1000 --user-group --shell /bin/bash agent
mkdir -p /workspace /run/crucible /run/crucible-out /run/crucible-pristine
chown agent:agent /workspace
rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/* /var/log/*.log
"""
IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@sandbox GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@sandbox",
    "WORKDIR /",
    'CMD ["/bin/bash"]',
)


@dataclass(frozen=True, kw_only=True)
class DebianRoot:
    """A root filesystem that debootstrap makes from Debian's packages and `docker import` tags
    `<repository>:<hash of every input>`."""

    repository: str
    suite: str
    packages: tuple[str, ...]
    setup: str
    """Run in the root filesystem (chroot) before it is packed."""
    changes: tuple[str, ...] = IMPORT_CHANGES

    def digest(self) -> str:
        inputs = {"v": BUILDER_VERSION, "suite": self.suite, "variant": VARIANT, "packages": self.packages,
                  "setup": self.setup, "changes": self.changes}
        return _sha(json.dumps(inputs, sort_keys=True).encode())[:12]

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.digest()}"


BASE_ROOT = DebianRoot(repository="crucible/base", suite=SUITE, packages=PACKAGES, setup=SETUP_SCRIPT)
"""The sandboxes' base: Debian 12 (bookworm), the release of the machines Crucible runs on."""


@dataclass(frozen=True, kw_only=True)
class BuiltImage:
    name: str
    tag: str
    built: bool
    """False when the tag already existed (nothing was done)."""
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


CONTEXT_FILE = "context.json"
"""An image folder's list of files from elsewhere: {folder in the build context: source}, a source being
`crucible:<folder of this project>` or `package:<installed package>/<folder in it>`."""


def _extras(context: Path) -> dict[str, Path]:
    """The folders an image's CONTEXT_FILE names, as {folder in the build context: source folder}."""
    import importlib.util

    listed = context / CONTEXT_FILE
    if not listed.is_file():
        return {}
    folders: dict[str, Path] = {}
    for folder, source in json.loads(listed.read_text()).items():
        scheme, _, where = source.partition(":")
        if scheme == "crucible":
            folders[folder] = IMAGES_DIR.parents[1] / where
        elif scheme == "package":
            package, _, inner = where.partition("/")
            found = importlib.util.find_spec(package)
            if found is None or not found.submodule_search_locations:
                raise ImageBuildError(f"{context.name} image: expected the installed package {package!r} "
                                      f"({listed.name} names it), got none")
            folders[folder] = Path(next(iter(found.submodule_search_locations))) / inner
        else:
            raise ImageBuildError(f"{listed}: {folder}: expected crucible:<folder> or package:<name>/<folder>, "
                                  f"got {source!r}")
    return folders


def _context_files(context: Path) -> list[tuple[str, Path]]:
    """(path in the build context, source) for every file of an image's context, its extras included."""
    files = [(p.relative_to(context).as_posix(), p) for p in context.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p != context / CONTEXT_FILE]
    for folder, source in _extras(context).items():
        files += [(f"{folder}/{p.relative_to(source).as_posix()}", p) for p in source.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts]
    return sorted(files)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def base_hash() -> str:
    return BASE_ROOT.digest()


def environment_names() -> list[str]:
    return sorted(p.parent.name for p in IMAGES_DIR.glob("*/Dockerfile"))


def context_hash(context: Path, *, base_tag: str) -> str:
    """Hash of the base tag and every file (path, mode's exec bit, bytes) of a build context."""
    digest = hashlib.sha256(f"{BUILDER_VERSION}\n{base_tag}\n".encode())
    for name, path in _context_files(context):
        digest.update(f"{name}\n{os.access(path, os.X_OK)}\n".encode())
        digest.update(_sha(path.read_bytes()).encode())
    return digest.hexdigest()[:12]


def _image_exists(api: docker.APIClient, tag: str) -> bool:
    try:
        api.inspect_image(tag)
        return True
    except NotFound:
        return False


def _tag_latest(api: docker.APIClient, tag: str) -> None:
    repository = tag.rsplit(":", 1)[0]
    api.tag(tag, repository, "latest", force=True)


def build_base(*, api: docker.APIClient, cache_dir: Path, base_image: str | None = None, force: bool = False) -> BuiltImage:
    """The base image: `base_image` if given (must exist locally), else debootstrap + docker import."""
    if base_image:
        if not _image_exists(api, base_image):
            raise ImageBuildError(
                f"CRUCIBLE_SANDBOX_BASE_IMAGE: expected a local image, got {base_image!r} (not on this engine; "
                "load it with `docker load` or unset the setting to build one with debootstrap)"
            )
        return BuiltImage(name="base", tag=base_image, built=False, seconds=0.0)
    return build_root(BASE_ROOT, api=api, cache_dir=cache_dir, force=force, name="base")


def build_root(root: DebianRoot, *, api: docker.APIClient, cache_dir: Path, force: bool = False,
               name: str | None = None) -> BuiltImage:
    """`root.tag`: debootstrap + docker import, the root filesystem's tarball cached in `cache_dir`; a no-op
    when the tag exists."""
    started = time.monotonic()
    name = name or root.repository
    digest = root.digest()
    tag = root.tag
    if _image_exists(api, tag) and not force:
        _tag_latest(api, tag)
        return BuiltImage(name=name, tag=tag, built=False, seconds=time.monotonic() - started)
    tarball = cache_dir / f"{root.repository.rsplit('/', 1)[-1]}-{digest}.tar"
    if not tarball.exists() or force:
        _debootstrap_tarball(root, cache_dir=cache_dir, tarball=tarball)
    log.info("importing %s as %s", tarball, tag)
    try:
        api.import_image_from_file(str(tarball), repository=root.repository, tag=digest, changes=list(root.changes))
    except APIError as error:
        raise ImageBuildError(f"docker import: expected {tarball} to import, got {error}") from None
    _tag_latest(api, tag)
    return BuiltImage(name=name, tag=tag, built=True, seconds=time.monotonic() - started)


def _debootstrap_tarball(root: DebianRoot, *, cache_dir: Path, tarball: Path) -> None:
    if os.geteuid() != 0:
        raise ImageBuildError(
            "debootstrap: expected to run as root (it builds a root filesystem), got uid "
            f"{os.geteuid()}; run `sudo crucible images build` or set CRUCIBLE_SANDBOX_BASE_IMAGE"
        )
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap: expected the debootstrap command (apt-get install debootstrap), got none")
    debs = cache_dir / "debs"
    work = cache_dir / f"rootfs-{os.getpid()}"
    debs.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    try:
        _run(["debootstrap", f"--variant={VARIANT}", f"--include={','.join(root.packages)}",
              f"--cache-dir={debs}", root.suite, str(work), MIRROR], what="debootstrap")
        _run(["chroot", str(work), "/bin/sh", "-c", root.setup], what="root filesystem setup")
        partial = tarball.with_suffix(".partial")
        _run(["tar", "--numeric-owner", "-C", str(work), "-cf", str(partial), "."], what="tar")
        partial.replace(tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(argv: list[str], *, what: str) -> None:
    log.info("%s: %s", what, " ".join(argv[:4]))
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-1500:]
        raise ImageBuildError(f"{what}: expected exit 0, got {done.returncode}:\n{tail}")


def build_environment(
    name: str, *, api: docker.APIClient, base_tag: str, images_dir: Path = IMAGES_DIR, force: bool = False
) -> BuiltImage:
    """`crucible/<name>:<hash>` from `<images_dir>/<name>/Dockerfile` on top of `base_tag`."""
    started = time.monotonic()
    context = images_dir / name
    if not (context / "Dockerfile").is_file():
        known = ", ".join(sorted(p.parent.name for p in images_dir.glob("*/Dockerfile"))) or "none"
        raise ImageBuildError(f"image: expected one of {known}, got {name!r}")
    digest = context_hash(context, base_tag=base_tag)
    tag = f"crucible/{name}:{digest}"
    if _image_exists(api, tag) and not force:
        _tag_latest(api, tag)
        return BuiltImage(name=name, tag=tag, built=False, seconds=time.monotonic() - started)
    log.info("building %s from %s", tag, context)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix=f"crucible-build-{name}-") as assembled:
        for relative, source in _context_files(context):
            target = Path(assembled) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        _docker_build(api, name=name, context=Path(assembled), tag=tag, base_tag=base_tag, digest=digest, lines=lines)
    _tag_latest(api, tag)
    return BuiltImage(name=name, tag=tag, built=True, seconds=time.monotonic() - started)


def _docker_build(api: docker.APIClient, *, name: str, context: Path, tag: str, base_tag: str, digest: str,
                  lines: list[str]) -> None:
    for chunk in api.build(
        path=str(context), tag=tag, buildargs={"BASE_IMAGE": base_tag}, network_mode="host",
        rm=True, forcerm=True, pull=False, decode=True, labels={"crucible.inputs": digest},
    ):
        if "error" in chunk:
            raise ImageBuildError(f"docker build {name}: {chunk['error'].strip()}\n" + "".join(lines[-20:]))
        lines.append(str(chunk.get("stream", "")))


def build_images(
    *,
    names: list[str] | None = None,
    force: bool = False,
    data_dir: Path | None = None,
    base_image: str | None = None,
    images_dir: Path = IMAGES_DIR,
) -> list[BuiltImage]:
    """Build the base and the named environment images (all by default); unchanged ones are no-ops."""
    if data_dir is None or base_image is None:
        from core.settings import get_settings

        settings = get_settings()
        data_dir = data_dir or settings.data_dir
        base_image = base_image if base_image is not None else settings.sandbox_base_image
    api = docker_api()
    with _build_lock(data_dir / "images"):  # another process building the same images waits, then finds them
        base = build_base(api=api, cache_dir=data_dir / "images", base_image=base_image or None, force=force)
        wanted = names if names is not None else sorted(p.parent.name for p in images_dir.glob("*/Dockerfile"))
        built = [base]
        for name in wanted:
            built.append(build_environment(name, api=api, base_tag=base.tag, images_dir=images_dir, force=force))
    return built


@contextmanager
def _build_lock(cache_dir: Path) -> Iterator[None]:
    """An exclusive lock on the image cache for one build (released when the process dies, too)."""
    import fcntl

    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def image_tag(name: str, *, base_image: str | None = None) -> str:
    """The content-hash tag `build_images` gives `name` ("base" or an environment) right now."""
    if name == "base":
        return base_image or f"crucible/base:{base_hash()}"
    base = base_image or f"crucible/base:{base_hash()}"
    return f"crucible/{name}:{context_hash(IMAGES_DIR / name, base_tag=base)}"
