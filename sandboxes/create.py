"""Making a sandbox: its id, the labels its container carries for life, the container, and the ready check
of its shell; nothing is left behind if any of it fails. What a sandbox is and does: sandboxes/sandbox.py.
"""

from __future__ import annotations

import json
import secrets
import time

from sandboxes import labels as L
from sandboxes.backend import ImageSource, SandboxBackend
from sandboxes.errors import ImageNotFound, SandboxDead, SessionError
from sandboxes.events import EventKind, EventRecorder, EventSink, NullEventSink
from sandboxes.sandbox import DEFAULT_LEASE_TTL_S, Sandbox
from sandboxes.spec import SandboxSpec


def new_sandbox_id() -> str:
    return "sb-" + secrets.token_hex(5)


def is_sandbox_id(value: str) -> bool:
    """`value` is shaped as new_sandbox_id makes them (sb- and 10 hex digits)."""
    return len(value) == 13 and value.startswith("sb-") and all(c in "0123456789abcdef" for c in value[3:])


def sandbox_labels(
    *, sandbox_id: str, spec: SandboxSpec, owner: L.Owner, worker: str | None, lease_ttl_s: float,
    run_id: int | None, episode_id: int | None, env_name: str | None, pools: str | None = None,
) -> dict[str, str]:
    """Every label a sandbox container carries (immutable for its life; the lease file renews)."""
    now = time.time()
    values = {
        L.OWNER: str(owner),
        L.WORKER: worker or "",
        L.LEASE_EXPIRES: str(int(now + lease_ttl_s)),
        L.RUN: "" if run_id is None else str(run_id),
        L.EPISODE: "" if episode_id is None else str(episode_id),
        L.ENV: env_name or "",
        L.SPEC: spec.spec_hash,
        L.SPEC_JSON: json.dumps(spec.model_dump(mode="json"), separators=(",", ":")),
        L.SANDBOX_ID: sandbox_id,
        L.CREATED: str(int(now)),
        L.CREATOR: str(L.Owner.current()),
    }
    if pools is not None:
        values[L.POOLS] = pools
    return values


def create_sandbox(
    *,
    backend: SandboxBackend,
    spec: SandboxSpec,
    events: EventSink | None = None,
    owner: L.Owner | None = None,
    worker: str | None = None,
    run_id: int | None = None,
    episode_id: int | None = None,
    env_name: str | None = None,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    pools: str | None = None,
    images: ImageSource | None = None,
) -> Sandbox:
    """Create, start and ready-check a sandbox; nothing is left behind if any of it fails. `pools`: the
    PoolSet making it (label POOLS), whose close removes it whatever path it leaked by. `images`: where an
    image the engine lacks is pulled from, by digest (a PULL event); None: nowhere."""
    sandbox_id = new_sandbox_id()
    recorder = EventRecorder(sink=events or NullEventSink(), sandbox_id=sandbox_id, worker=worker)
    recorder.run_id, recorder.episode_id = run_id, episode_id
    labels = sandbox_labels(
        sandbox_id=sandbox_id, spec=spec, owner=owner or L.Owner.current(), worker=worker,
        lease_ttl_s=lease_ttl_s, run_id=run_id, episode_id=episode_id, env_name=env_name, pools=pools,
    )
    with recorder.timed(EventKind.CREATE, image=spec.image, spec=spec.spec_hash):
        container_id = _created(backend, spec=spec, labels=labels, name=f"crucible-{sandbox_id}", images=images,
                                recorder=recorder)
        recorder.container_id = container_id
        sandbox = Sandbox(
            backend=backend, container_id=container_id, sandbox_id=sandbox_id, spec=spec,
            events=recorder, lease_ttl_s=lease_ttl_s,
        )
        try:
            sandbox.prepare()
        except BaseException as error:
            sandbox.destroy(reason=f"create_failed: {type(error).__name__}")
            if isinstance(error, SessionError | SandboxDead):
                raise SandboxDead(f"sandbox {sandbox_id}: expected a ready shell, got {error}") from None
            raise
    return sandbox


def _created(backend: SandboxBackend, *, spec: SandboxSpec, labels: dict[str, str], name: str,
             images: ImageSource | None, recorder: EventRecorder) -> str:
    """The container, its image pulled first if the engine lacks it and `images` knows where it is."""
    try:
        return backend.create_container(spec=spec, labels=labels, name=name)
    except ImageNotFound:
        reference = None if images is None else images(spec.image)
        if reference is None:
            raise
    with recorder.timed(EventKind.PULL, image=spec.image, reference=reference):
        backend.pull_image(reference, as_image=spec.image)
    return backend.create_container(spec=spec, labels=labels, name=name)
