"""Docker sandboxes for agent episodes: spec, backend, persistent shell, warm pool, reaper.

    from task_workers.sandbox import SandboxPool, SandboxSpec, make_backend

    spec = SandboxSpec(image="crucible/code-repo:latest", workspace_seed="/opt/seed")
    with SandboxPool(spec=spec, backend=make_backend("docker"), min_size=2) as pool:
        with pool.lease(run_id=1, episode_id=7) as sandbox:
            result = sandbox.step("python3 -m pytest -q", timeout=60)
            print(result.status, result.exit_code, result.stdout)

Modules: spec (SandboxSpec), backend (protocol + registry), docker_backend, shell + driver (the
persistent shell), sandbox (lifecycle), files (tar in/out), reset, pool, reaper, events / db_events
(the EventSink seam), admin (what the CLI calls), errors.
"""

from task_workers.sandbox.backend import (
    ContainerInfo,
    ExecResult,
    SandboxBackend,
    make_backend,
    register_backend,
)
from task_workers.sandbox.errors import (
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
from task_workers.sandbox.events import (
    EventKind,
    EventSink,
    InMemoryEventSink,
    NullEventSink,
    SandboxEventData,
)
from task_workers.sandbox.pool import PoolSet, PoolStats, SandboxPool
from task_workers.sandbox.reaper import Reaper, start_reaper
from task_workers.sandbox.sandbox import Sandbox, create_sandbox
from task_workers.sandbox.shell import StepResult, StepStatus
from task_workers.sandbox.spec import SandboxSpec

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
