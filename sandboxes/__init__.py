"""Docker sandboxes for agent episodes: spec, backend, persistent shell, warm pool, reaper.

    from sandboxes import SandboxPool, SandboxSpec, make_backend

    spec = SandboxSpec(image="crucible/code-repo:latest", workspace_seed="/opt/seed")
    with SandboxPool(spec=spec, backend=make_backend("docker"), min_size=2) as pool:
        with pool.lease(run_id=1, episode_id=7) as sandbox:
            result = sandbox.step("python3 -m pytest -q", timeout_s=60)
            print(result.status, result.exit_code, result.stdout)

Modules: spec (SandboxSpec), backend (protocol + registry), docker_backend, shell + driver (the
persistent shell), sandbox (lifecycle), files (tar in/out), reset, pool, reaper, events / db_events
(the EventSink seam), admin (what the CLI calls), errors.
"""

from sandboxes.backend import (
    ContainerInfo,
    ExecResult,
    SandboxBackend,
    make_backend,
    register_backend,
)
from sandboxes.create import create_sandbox
from sandboxes.errors import (
    AcquireTimeout,
    BackendUnavailable,
    ImageNotFound,
    PoolClosed,
    ResetFailed,
    SandboxDead,
    SandboxError,
    SandboxNotFound,
    SessionError,
    SpecError,
)
from sandboxes.events import (
    EventKind,
    EventSink,
    InMemoryEventSink,
    NullEventSink,
    SandboxEventData,
)
from sandboxes.pool import PoolStats, SandboxPool
from sandboxes.pool_set import PoolSet
from sandboxes.reaper import Reaper, start_reaper
from sandboxes.sandbox import Sandbox
from sandboxes.shell import StepResult, StepStatus
from sandboxes.spec import SandboxSpec

__all__ = [
    "AcquireTimeout",
    "BackendUnavailable",
    "ContainerInfo",
    "EventKind",
    "EventSink",
    "ExecResult",
    "ImageNotFound",
    "InMemoryEventSink",
    "NullEventSink",
    "PoolClosed",
    "PoolSet",
    "PoolStats",
    "Reaper",
    "ResetFailed",
    "Sandbox",
    "SandboxBackend",
    "SandboxDead",
    "SandboxError",
    "SandboxEventData",
    "SandboxNotFound",
    "SandboxPool",
    "SandboxSpec",
    "SessionError",
    "SpecError",
    "StepResult",
    "StepStatus",
    "create_sandbox",
    "make_backend",
    "register_backend",
    "start_reaper",
]
