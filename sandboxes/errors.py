"""The sandbox layer's exceptions.

    CrucibleError (core.errors)
    └── SandboxError                 anything the sandbox layer raises on purpose
        ├── SpecError (ValueError)   a SandboxSpec field has a value we cannot use
        ├── BackendUnavailable       the container engine does not answer
        ├── ImageNotFound            the spec's image is not on this engine
        ├── SandboxNotFound          an id or prefix names no sandbox (or several)
        ├── SandboxDead              the container is gone or cannot run commands
        ├── SessionError             the persistent shell broke its protocol or could not start
        ├── ResetFailed              a reset did not leave a verified clean sandbox
        ├── PoolClosed               acquire on a closed pool
        ├── AcquireTimeout           no sandbox became free in time
        └── ImageBuildError          an image could not be built

A step's own outcome (timeout, OOM, truncated output) is never an exception: it is a StepResult status.
ActionRefused is not a SandboxError: it is the agent's mistake (a wrong action), never retried.
Every message says what was expected and what was given.
"""

from __future__ import annotations

from core.errors import CrucibleError


class SandboxError(CrucibleError):
    """Base of every error the sandbox layer raises on purpose."""


class SpecError(SandboxError, ValueError):
    """A SandboxSpec field is invalid; the message names the field, the expectation and the value."""


class BackendUnavailable(SandboxError):
    """The container engine cannot be reached."""


class ImageNotFound(SandboxError):
    """The image a spec names does not exist on the engine."""


class SandboxNotFound(SandboxError):
    """No sandbox (or more than one) matches an id or container-id prefix."""


class SandboxDead(SandboxError):
    """The container stopped, was removed, or cannot start a process."""


class SessionError(SandboxError):
    """The persistent shell session could not start or broke its protocol."""


class ResetFailed(SandboxError):
    """Reset could not verify a clean sandbox; the caller destroys and replaces it."""


class PoolClosed(SandboxError):
    """The pool was closed; it hands out nothing more."""


class AcquireTimeout(SandboxError):
    """Every sandbox stayed leased and the pool was full until the deadline."""


class ImageBuildError(SandboxError):
    """debootstrap, docker import or docker build failed."""


class ActionRefused(Exception):
    """A sandbox-side service (the browser driver) refused a request as wrong — an unknown element, a
    bad argument: the agent's mistake, shown to it as a tool error. Faults of the machine are
    SandboxErrors instead (retried)."""
