"""A package's own sandbox image: an environment image plus the wheels of what the package's tests need.

    tag = package_image("crucible/code-repo:3f2a…", "mylib-1.0", ["wcwidth==0.2.13"])
    # → crucible-factory/mylib-1.0:<hash>, built once; the same requirements give the same tag

The wheels are resolved and unpacked on the host by pip, from the package indexes pip is configured with
(`pip install --target --only-binary=:all:`: wheels only, so no package's build backend or setup.py runs
anywhere), then copied into the image's site-packages. The build itself has no network (`network_mode:
none`), and neither has any sandbox of the image. The tag is the hash of the base image and of every
file installed, so a changed wheel is a new image and an unchanged one is never rebuilt.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from environments.images.build import ImageBuildError, _image_exists
from sandboxes.docker_client import docker_api

REPOSITORY = "crucible-factory"
"""Where package images are tagged: an environment's `task_images` allows `crucible-factory/*` to play them."""
PIP_DEADLINE_S = 600.0
MAX_INSTALLED_BYTES = 1 << 30
"""What a package's requirements may install: metadata names them, and a name can pull in torch."""
log = logging.getLogger(__name__)

DOCKERFILE = """FROM {base}
USER root
COPY site/ /tmp/crucible-site/
# The image's interpreter must be the one the wheels were resolved for, and its site-packages is asked,
# not assumed (Debian's is /usr/local/lib/python3.X/dist-packages).
RUN python3 -c 'import sys; v = sys.version_info[:2]; assert v == {version}, f"python3 is {{v}}, expected {version}"' \\
 && target=$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \\
 && mkdir -p "$target" && cp -r /tmp/crucible-site/. "$target/" && rm -rf /tmp/crucible-site \\
 && chmod -R a+rX "$target"
"""


def package_image(base_tag: str, package: str, requirements: list[str]) -> str:
    """The tag of `base_tag` + `requirements` installed (built if it is not there yet). `requirements` are
    checked PEP 508 strings without URLs (factory.requirements.check_requirements). ImageBuildError names
    the requirement pip could not install as a wheel, or the build's last lines."""
    return wheel_image(base_tag, repository=REPOSITORY, name=package, requirements=requirements)


def wheel_image(base_tag: str, *, repository: str, name: str, requirements: list[str],
                files: dict[str, bytes] | None = None, steps: str = "", python: tuple[int, int] | None = None) -> str:
    """`<repository>/<name>:<hash>`: `base_tag` with the wheels of `requirements` in its site-packages, then
    `files` (paths relative to the build context, e.g. `extra/app.py`) and the Dockerfile `steps` that use
    them, run with no network. The hash covers all of it. `python`: the image's CPython (major, minor) when it
    is not this interpreter's; the wheels are then resolved for it and Linux on this machine's architecture."""
    api = docker_api()
    with tempfile.TemporaryDirectory(prefix="crucible-package-image-") as directory:
        context = Path(directory)
        site = context / "site"
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
                "--target", str(site), "--only-binary=:all:", "--no-compile", "--ignore-installed",
                "--no-warn-script-location", *(_for_python(python) if python else []), "--", *requirements]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_DEADLINE_S, check=False)
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"pip did not resolve {', '.join(requirements)} within "
                                  f"{PIP_DEADLINE_S:g} s") from None
        if done.returncode != 0:
            raise ImageBuildError(f"expected wheels for {', '.join(requirements)} from the package "
                                  f"index, got pip's error: {_last_error(done.stderr)}")
        for scripts in (site / "bin",):  # console scripts name the host's interpreter; the tests import modules
            if scripts.is_dir():
                subprocess.run(["rm", "-rf", "--", str(scripts)], check=True)
        installed = sum(path.stat().st_size for path in site.rglob("*") if path.is_file() and not path.is_symlink())
        if installed > MAX_INSTALLED_BYTES:
            raise ImageBuildError(f"expected at most {MAX_INSTALLED_BYTES >> 20} MiB installed for "
                                  f"{', '.join(requirements)}, got {installed >> 20} MiB")
        version = python or tuple(sys.version_info[:2])
        digest = hashlib.sha256(_tree_hash(site, base_tag=base_tag, version=version).encode())
        for path, data in sorted((files or {}).items()):
            digest.update(f"{path}\0{hashlib.sha256(data).hexdigest()}\0".encode())
        digest.update(steps.encode())
        tag = f"{repository}/{_repository_name(name)}:{digest.hexdigest()[:12]}"
        if _image_exists(api, tag):
            return tag
        for path, data in (files or {}).items():
            target = context / path
            if context.resolve() not in target.resolve().parents:
                raise ImageBuildError(f"expected a file inside the build context, got {path!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        (context / "Dockerfile").write_text(DOCKERFILE.format(base=base_tag, version=version) + steps)
        log.info("building %s (%s)", tag, ", ".join(requirements))
        lines: list[str] = []
        for chunk in api.build(path=str(context), tag=tag, network_mode="none", rm=True, forcerm=True, pull=False,
                               decode=True, labels={"crucible.inputs": tag.rsplit(":", 1)[1], "crucible.package": name[:200]}):
            if "error" in chunk:
                raise ImageBuildError(f"docker build of its image: {chunk['error'].strip()[:400]}")
            lines.append(str(chunk.get("stream", "")))
    return tag


def _for_python(python: tuple[int, int]) -> list[str]:
    """pip's options to resolve wheels for another CPython on Linux (glibc up to Debian 13's 2.41). Its
    Requires-Python check reads the running interpreter even so: the target version decides instead."""
    major, minor = python
    arch = platform.machine()
    platforms = [f"manylinux_2_{glibc}_{arch}" for glibc in range(41, 4, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    return ["--python-version", f"{major}.{minor}", "--implementation", "cp", "--abi", f"cp{major}{minor}",
            "--ignore-requires-python", *(option for tag in platforms for option in ("--platform", tag))]


def _tree_hash(site: Path, *, base_tag: str, version: tuple[int, ...]) -> str:
    digest = hashlib.sha256(f"{base_tag}\n{version}\n".encode())
    for path in sorted(p for p in site.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(site)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


def _repository_name(package: str, *, default: str = "package") -> str:
    return re.sub(r"[^a-z0-9._-]", "-", package.lower()).strip("._-")[:100] or default


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:400]
