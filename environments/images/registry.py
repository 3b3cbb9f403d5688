"""Sandbox images through a registry, for hosts that never built them.

    crucible images push                      # to CRUCIBLE_IMAGE_REGISTRY: every crucible image this host holds
    push_images(["crucible/code-repo:d3d1fd99dc47"], registry="10.0.0.1:5000")
    catalogued("crucible/code-repo:d3d1fd99dc47")  # → "10.0.0.1:5000/crucible/code-repo@sha256:…" or None

The host that builds the images (`crucible images build`, the factory's package images, `crucible
images openenv`) pushes them to the registry the operator names; each push records, in the catalogue
(`sandbox_images`), the registry, the image's repository there and the digest the registry answered. A
worker host whose engine lacks a spec's image pulls `repository@digest` — by digest, never by a tag
someone could move — from the registry as that host reaches it (its own CRUCIBLE_IMAGE_REGISTRY, else
the address the image was pushed to: hosts on different networks may name one registry differently),
and names it as the spec does, before the sandbox is created (sandboxes/create.py, a `pull` sandbox
event). Pushing is idempotent: a pushed image pushed again answers the same digest.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from core.db import session_scope
from core.errors import ConfigError
from core.models import SandboxImage
from core.settings import get_settings, registry_address
from environments.images.build import environment_names, image_tag
from environments.images.packages import REPOSITORY as FACTORY_REPOSITORY
from sandboxes.docker_client import docker_api
from sandboxes.errors import ImageNotFound, SandboxError

log = logging.getLogger(__name__)

PUSHED_REPOSITORIES = ("crucible/", f"{FACTORY_REPOSITORY}/", "crucible-openenv/")
"""The repositories `crucible images push` pushes by default: the platform's, the factory's package images
and the OpenEnv images."""


@dataclass(frozen=True)
class Pushed:
    image: str
    reference: str
    """`registry/repository@sha256:…`: what a worker host pulls."""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def registry_of(registry: str | None) -> str:
    """The registry named (checked), else CRUCIBLE_IMAGE_REGISTRY; ConfigError if neither is set."""
    if registry is not None:
        try:
            return registry_address(registry)
        except ValueError as error:
            raise ConfigError(f"--registry: {error}, got {registry[:200]!r}") from None
    configured = get_settings().image_registry
    if configured is None:
        raise ConfigError("expected a registry to push to (--registry or CRUCIBLE_IMAGE_REGISTRY, e.g. "
                          "10.0.0.1:5000), got neither")
    return configured


def local_images() -> list[str]:
    """Every image of PUSHED_REPOSITORIES this host's engine holds, by its content-hash tag (not `latest`),
    the current base and environment images first."""
    api = docker_api()
    current = [image_tag(name, base_image=get_settings().sandbox_base_image) for name in ["base", *environment_names()]]
    held = {tag for image in api.images() for tag in (image.get("RepoTags") or [])
            if tag.startswith(PUSHED_REPOSITORIES) and not tag.endswith(":latest")}
    return [tag for tag in current if tag in held] + sorted(held - set(current))


def push_images(images: list[str], *, registry: str) -> list[Pushed]:
    """Push each local image to `registry` and record its digest in the catalogue."""
    api = docker_api()
    pushed = []
    for image in images:
        repository, tag = _split(image)
        remote = f"{registry}/{repository}"
        try:
            api.tag(image, remote, tag)
        except Exception as error:  # docker's NotFound, APIError: the image is not on this engine
            raise ImageNotFound(f"image: expected {image!r} on this host's Docker engine, got {str(error)[:300]}") from None
        try:
            digest = _push(api, remote, tag)
        finally:
            api.remove_image(f"{remote}:{tag}", noprune=True)  # the registry's name only: the image stays
        reference = f"{remote}@{digest}"
        values = {"pushed_to": registry, "repository": repository, "digest": digest}
        with session_scope() as session:
            session.execute(insert(SandboxImage).values(image=image, **values)
                            .on_conflict_do_update(index_elements=[SandboxImage.image], set_=values))
        log.info("pushed %s as %s", image, reference)
        pushed.append(Pushed(image=image, reference=reference))
    return pushed


def catalogued(image: str, *, registry: str | None = None) -> str | None:
    """Where a host that lacks `image` pulls it from, by digest (`registry/repository@sha256:…`); None if it
    was never pushed. `registry`: the registry as this host reaches it (default CRUCIBLE_IMAGE_REGISTRY, else
    the address it was pushed to). (The sandboxes.backend.ImageSource of worker hosts.)"""
    with session_scope() as session:
        row = session.execute(select(SandboxImage).where(SandboxImage.image == image)).scalar_one_or_none()
        if row is None:
            return None
        return f"{registry or get_settings().image_registry or row.pushed_to}/{row.repository}@{row.digest}"


def _push(api: object, remote: str, tag: str) -> str:
    """Push `remote:tag`; the digest the registry answered."""
    digest = None
    for line in api.push(remote, tag=tag, stream=True, decode=True):  # type: ignore[attr-defined]
        if "error" in line:
            raise SandboxError(f"push of {remote}:{tag}: expected the registry to take it, got "
                               f"{str(line['error'])[:300]}")
        digest = (line.get("aux") or {}).get("Digest", digest)
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise SandboxError(f"push of {remote}:{tag}: expected the registry to answer a sha256 digest, got {digest!r}")
    return digest


def _split(image: str) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        raise ConfigError(f"image: expected repository:tag (e.g. crucible/code-repo:d3d1fd99dc47), got {image[:200]!r}")
    return repository, tag
