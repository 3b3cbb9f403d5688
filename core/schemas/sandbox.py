"""SandboxSpec: what one sandbox is (image + limits + shell settings). Equal specs share a warm pool.

    spec = SandboxSpec(image="crucible/code-repo:3f2a…", memory="1g", workspace_seed="/opt/seed")
    spec.spec_hash        # stable 16-hex id of the normalised spec; labels every container

Sizes accept Docker's notation ("512m", "2g", "64k", or plain bytes) and are stored as bytes, so
"1g" and "1024m" are the same spec. Invalid values raise pydantic's ValidationError; `describe_errors`
turns it into one clause per field naming what was expected and what was given.

This is the pure schema (no Docker): environment specs validate their `sandbox` section against it at
registration, and `sandboxes.spec.SandboxSpec` (which raises SpecError) builds on it.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER = re.compile(r"^(\d+):(\d+)$")
_NAMED = re.compile(r"^[\w .+]+: expected ")  # a message that already names its field
# Paths the sandbox layer mounts or the kernel owns; a workdir there would shadow or break them.
_RESERVED_DIRS = ("/proc", "/sys", "/dev", "/run/crucible", "/run/crucible-out", "/run/crucible-pristine", "/tmp")
_FORBIDDEN_NETWORKS = ("bridge", "default", "host")
SIZE_FIELDS = ("memory", "workspace_size", "tmp_size", "home_size", "capture_size", "output_head", "output_tail")


def parse_size(value: object, *, field: str) -> int:
    """'512m' -> 536870912. Raises ValueError with the field's expectation."""
    expected = f'{field}: expected a size like "512m" or "2g", got {_show(value)}'
    if isinstance(value, bool):
        raise ValueError(expected)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(expected)
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(expected)
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_size(n: int) -> str:
    """536870912 -> '512m' (exact units only, else bytes)."""
    for unit in ("t", "g", "m", "k"):
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


class SandboxSpec(BaseModel):
    """One sandbox's image, resources, isolation and shell settings (frozen, hashable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str
    """Local Docker image (`crucible/<env>:<hash>` from `crucible images build`, or any local tag)."""
    cpus: float = 1.0
    """CPU quota in cores (Docker nano_cpus)."""
    memory: int = 2 << 30
    """Memory limit; swap is set equal, so there is no swap. tmpfs pages count against it too."""
    pids: int = 512
    """Most processes in the container (fork bombs stop here)."""
    workspace_size: int = 1 << 30
    """Size of the tmpfs mounted at `workdir`."""
    tmp_size: int = 512 << 20
    """Size of the tmpfs at /tmp."""
    home_size: int = 128 << 20
    """Size of the tmpfs at `home`."""
    capture_size: int = 64 << 20
    """Size of the tmpfs that captures one command's output before it is capped (head + tail)."""
    network: str = "none"
    """Docker network mode; only "none" unless `allow_network` is set."""
    allow_network: bool = False
    """Opt in to a named user-defined network (never the default bridge or the host network)."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables (a mapping is accepted; stored sorted as pairs so the spec is hashable)."""
    workdir: str = "/workspace"
    """The workspace (a tmpfs) and the shell's starting directory."""
    user: str = "1000:1000"
    """Non-root uid:gid every command runs as (the base image's `agent`)."""
    home: str = "/home/agent"
    """HOME of the sandbox user (a tmpfs)."""
    workspace_seed: str | None = None
    """A directory in the image copied into the workspace at creation (e.g. a git repo at /opt/seed)."""
    max_lifetime_s: int = 3600
    """The container's own entrypoint exits after this many seconds, whatever its owner does."""
    command_timeout_s: float = 60.0
    """Default per-command timeout, enforced inside the container."""
    output_head: int = 16 << 10
    """Bytes kept from the start of a command's output."""
    output_tail: int = 16 << 10
    """Bytes kept from the end of a command's output; the bytes between are counted, not returned."""
    nofile: int = 65536
    """Open-file limit (soft = hard); clamped to the engine's own hard limit if that is lower."""
    masked_paths: tuple[str, ...] = ()
    """Directories of the image hidden from every process in the sandbox: an empty read-only tmpfs is mounted
    over each (a task's own image keeps its repository there, history included)."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Self:
        """Build from a config mapping (environment spec, JSON label)."""
        return cls(**dict(data))

    @property
    def spec_hash(self) -> str:
        """16 hex digits identifying the normalised spec."""
        unset = {"masked_paths"} if not self.masked_paths else set()  # specs from before the field keep their hash
        return hashlib.sha256(self.model_dump_json(exclude=unset).encode()).hexdigest()[:16]

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @field_validator(*SIZE_FIELDS, mode="before")
    @classmethod
    def _sizes(cls, value: object, info: Any) -> int:
        return parse_size(value, field=info.field_name)

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not value.strip() or any(c.isspace() for c in value):
            raise ValueError(f'image: expected an image reference like "crucible/base:1a2b3c", got {_show(value)}')
        return value

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, value: float) -> float:
        if not 0.01 <= value <= 256:
            raise ValueError(f"cpus: expected a number of cores between 0.01 and 256, got {value!r}")
        return value

    @field_validator("pids")
    @classmethod
    def _pids(cls, value: int) -> int:
        if not 32 <= value <= 1 << 20:
            raise ValueError(f"pids: expected a process limit between 32 and 1048576, got {value!r}")
        return value

    @field_validator("nofile")
    @classmethod
    def _nofile(cls, value: int) -> int:
        if not 64 <= value <= 1 << 20:
            raise ValueError(f"nofile: expected an open-file limit between 64 and 1048576, got {value!r}")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: object) -> tuple[tuple[str, str], ...]:
        pairs: list[tuple[Any, ...]]
        if isinstance(value, Mapping):
            pairs = list(value.items())
        elif isinstance(value, list | tuple):
            pairs = [tuple(item.split("=", 1)) if isinstance(item, str) else tuple(item) for item in value]
        else:
            raise ValueError(f"env: expected a mapping of names to strings, got {value!r}")
        for pair in pairs:
            if len(pair) != 2 or not isinstance(pair[0], str) or not _ENV_NAME.match(pair[0]):
                raise ValueError(f"env: expected NAME=value pairs with NAME like FOO_BAR, got {pair!r}")
            if not isinstance(pair[1], str) or "\0" in pair[1]:
                raise ValueError(f"env: expected a string without NUL bytes for {pair[0]}, got {pair[1]!r}")
        return tuple(sorted((str(k), str(v)) for k, v in pairs))

    @field_validator("workdir", "home")
    @classmethod
    def _dirs(cls, value: str, info: Any) -> str:
        norm = posixpath.normpath(value) if value.startswith("/") else ""
        if not norm or norm == "/" or any(norm == d or norm.startswith(d + "/") for d in _RESERVED_DIRS):
            raise ValueError(
                f'{info.field_name}: expected an absolute directory like "/workspace" outside '
                f"{', '.join(_RESERVED_DIRS)}, got {_show(value)}"
            )
        return norm

    @field_validator("masked_paths", mode="before")
    @classmethod
    def _masked(cls, value: object) -> tuple[str, ...]:
        paths = [value] if isinstance(value, str) else value
        if not isinstance(paths, list | tuple) or len(paths) > 8:
            raise ValueError(f"masked_paths: expected at most 8 absolute directories, got {_show(value)}")
        out = []
        for path in paths:
            norm = posixpath.normpath(path) if isinstance(path, str) and path.startswith("/") else ""
            if (not norm or norm == "/" or "\0" in norm or any(c.isspace() or c in ",:" for c in norm)
                    or any(norm == d or norm.startswith(d + "/") or d.startswith(norm + "/") for d in (*_RESERVED_DIRS, "/etc", "/usr", "/bin", "/lib"))):
                raise ValueError(f'masked_paths: expected absolute directories of the image such as "/testbed", '
                                 f"outside the system's and the sandbox's own, got {_show(path)}")
            out.append(norm)
        return tuple(sorted(set(out)))

    @field_validator("workspace_seed")
    @classmethod
    def _seed(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or posixpath.normpath(value) == "/"):
            raise ValueError(f'workspace_seed: expected an absolute directory in the image, got {_show(value)}')
        return posixpath.normpath(value) if value else None

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        match = _USER.match(value)
        if match is None or match.group(1) == "0":
            raise ValueError(f'user: expected a non-root numeric "uid:gid" like "1000:1000", got {_show(value)}')
        return value

    @field_validator("max_lifetime_s")
    @classmethod
    def _lifetime(cls, value: int) -> int:
        if not 30 <= value <= 7 * 86400:
            raise ValueError(f"max_lifetime_s: expected seconds between 30 and 604800, got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SandboxSpec:
        if self.network != "none" and not self.allow_network:
            raise ValueError(
                f'network: expected "none" (sandboxes have no network; set allow_network=True to use a '
                f"named network), got {_show(self.network)}"
            )
        if self.network in _FORBIDDEN_NETWORKS or self.network.startswith("container:"):
            raise ValueError(
                f'network: expected "none" or a user-defined network name ({", ".join(_FORBIDDEN_NETWORKS)} '
                f"are never allowed), got {_show(self.network)}"
            )
        if not 0 < self.command_timeout_s <= self.max_lifetime_s:
            raise ValueError(
                f"command_timeout_s: expected seconds above 0 and at most max_lifetime_s "
                f"({self.max_lifetime_s}), got {self.command_timeout_s!r}"
            )
        if self.output_head + self.output_tail > self.capture_size or self.output_head + self.output_tail < 64:
            raise ValueError(
                f"output_head + output_tail: expected between 64 bytes and capture_size "
                f"({format_size(self.capture_size)}), got {self.output_head + self.output_tail}"
            )
        if self.memory < 32 << 20:
            raise ValueError(f'memory: expected at least "32m", got "{format_size(self.memory)}"')
        if self.workdir == self.home:
            raise ValueError(f"home: expected a directory other than workdir, got {_show(self.home)}")
        for masked in self.masked_paths:
            for own in (self.workdir, self.home):
                if masked == own or own.startswith(masked + "/") or masked.startswith(own + "/"):
                    raise ValueError(f"masked_paths: expected directories apart from workdir and home, got {_show(masked)}")
        return self


_EXPECTED_BY_TYPE = {
    "float_parsing": "a number",
    "float_type": "a number",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "missing": "a value (the field is required)",
}


def describe_errors(error: ValidationError, *, prefix: str = "") -> str:
    """One clause per bad field: `field: expected …, got …` (our own validators already say so)."""
    lines = []
    for item in error.errors():
        message = str(item["msg"]).removeprefix("Value error, ")
        field = prefix + (".".join(str(part) for part in item["loc"]) or "spec")
        if item["type"] == "value_error":
            lines.append(prefix + message if _NAMED.match(message) else f"{field}: {message}")
        elif item["type"] == "extra_forbidden":
            known = ", ".join(SandboxSpec.model_fields)
            lines.append(f"{field}: expected one of the known fields ({known}), got an unknown field")
        else:
            expected = _EXPECTED_BY_TYPE.get(item["type"], message)
            got = "nothing" if item["type"] == "missing" else _show(item.get("input"))
            lines.append(f"{field}: expected {expected}, got {got}")
    return "; ".join(lines)
