"""The SandboxBackend protocol (what a container engine must do for us) and the backend registry.

    backend = make_backend("docker")               # one per process is plenty; it is thread-safe
    cid = backend.create_container(spec=spec, labels=labels, name="crucible-sb-1a2b")

Backends own containers and raw process I/O; everything above (shell sessions, reset, pools,
reaping) is backend-agnostic and lives in the other modules.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandboxes import labels as L
from sandboxes.errors import SandboxError
from sandboxes.spec import SandboxSpec
from sandboxes.stream import ExecStream


@dataclass(frozen=True, kw_only=True)
class ContainerInfo:
    """What `list` / `get` report about one container."""

    id: str
    name: str
    image: str
    state: str  # created | running | paused | restarting | removing | exited | dead
    created_at: float
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def sandbox_id(self) -> str:
        return self.labels.get(L.SANDBOX_ID, self.id[:12])

    @property
    def owner(self) -> L.Owner:
        return L.Owner.parse(self.labels.get(L.OWNER, ""))

    @property
    def lease_expires(self) -> float:
        try:
            return float(self.labels.get(L.LEASE_EXPIRES, "0"))
        except ValueError:
            return 0.0

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.created_at)


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    """A one-off process run to completion (control tasks, file transfer, the CLI)."""

    exit_code: int
    output: bytes
    stderr: bytes = b""
    timed_out: bool = False


class SandboxBackend(Protocol):
    """A container engine. Implementations must be safe to call from several threads."""

    name: str

    def ping(self) -> None:
        """Raise BackendUnavailable if the engine does not answer."""

    def create_container(self, *, spec: SandboxSpec, labels: Mapping[str, str], name: str) -> str:
        """Create and start a container for `spec`; return its id. Nothing is left behind on failure."""

    def open_exec(
        self, container_id: str, *, argv: Sequence[str], user: str, env: Mapping[str, str], workdir: str
    ) -> ExecStream:
        """Start a process with stdin open; its stdout/stderr come back on the stream."""

    def exec(
        self,
        container_id: str,
        *,
        argv: Sequence[str],
        user: str,
        timeout_s: float,
        stdin: bytes | None = None,
        workdir: str = "/",
    ) -> ExecResult:
        """Run a process to completion, killed inside the container after `timeout_s`."""

    def pull_image(self, reference: str, *, as_image: str) -> None:
        """Pull an image by digest (`registry/repository@sha256:…`) and name it `as_image` on this engine."""

    def remove(self, container_id: str) -> bool:
        """Force-remove; True if this call removed it, False if it was already gone. Idempotent."""

    def list(self, *, labels: Mapping[str, str] | None = None) -> list[ContainerInfo]:
        """Every container (any state) carrying all of `labels` (default: any crucible owner)."""

    def get(self, container_id: str) -> ContainerInfo | None:
        """One container by full id or name, or None."""

    def logs(self, container_id: str, *, tail: int) -> bytes: ...

    def stats(self, container_id: str) -> dict[str, Any]: ...


ImageSource = Callable[[str], str | None]
"""A local image name → where to pull it from by digest (`registry/repository@sha256:…`), or None if
nowhere (environments/images/registry.py reads the catalogue `crucible images push` writes)."""
BackendFactory = Callable[..., SandboxBackend]
_BUILTIN = {"docker": "sandboxes.docker_backend:DockerBackend"}
_registry: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Class decorator: make a backend available as `make_backend(name)`."""

    def add(factory: BackendFactory) -> BackendFactory:
        _registry[name] = factory
        return factory

    return add


def make_backend(name: str = "docker", **options: Any) -> SandboxBackend:
    """Instantiate a registered backend (built-ins are imported on first use)."""
    if name not in _registry and name in _BUILTIN:
        module, _, _attr = _BUILTIN[name].partition(":")
        importlib.import_module(module)  # registers itself
    factory = _registry.get(name)
    if factory is None:
        known = ", ".join(sorted(set(_registry) | set(_BUILTIN)))
        raise SandboxError(f"sandbox backend: expected one of {known}, got {name!r}")
    return factory(**options)
