"""Operator services behind `crucible sandbox …`: find, list, attach, inspect and remove sandboxes.

These take a backend and ids and return plain data; the CLI only parses arguments and renders.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from sandboxes import labels as L
from sandboxes.backend import ContainerInfo, SandboxBackend
from sandboxes.create import create_sandbox
from sandboxes.errors import SandboxError, SandboxNotFound
from sandboxes.events import EventRecorder, EventSink, NullEventSink
from sandboxes.layout import HISTORY_DIR, KEEPER_USER, LEASE_FILE
from sandboxes.reaper import Reaper, Verdict
from sandboxes.reset import PRISTINE_GIT
from sandboxes.sandbox import Sandbox
from sandboxes.spec import SandboxSpec

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str) -> float:
    """'90s', '10m', '2h', '1d' -> seconds."""
    match = _DURATION.match(value.strip())
    if match is None:
        raise SandboxError(f'duration: expected a number with s, m, h or d like "10m", got "{value}"')
    return float(match.group(1)) * _SECONDS[match.group(2)]


@dataclass(frozen=True, kw_only=True)
class SandboxRow:
    sandbox_id: str
    container_id: str
    image: str
    state: str
    run: str
    episode: str
    env: str
    owner: str
    worker: str
    age_s: float
    lease_left_s: float
    spec: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Lease:
    """The lease file a sandbox's owner renews: who holds it now (labels only say who created it)."""

    expires: float
    run: str
    episode: str
    state: str

    @classmethod
    def parse(cls, text: str) -> Lease | None:
        fields = text.split()
        if len(fields) != 4:
            return None
        try:
            expires = float(fields[0])
        except ValueError:
            return None
        run, episode = ("" if v == "-" else v for v in fields[1:3])
        return cls(expires=expires, run=run, episode=episode, state=fields[3])

    @property
    def held_by_run(self) -> bool:
        """Leased to a run now: not idle, not being reset for the next episode, not expired."""
        return bool(self.run) and self.state == "leased" and self.expires > time.time()


def read_leases(backend: SandboxBackend, infos: list[ContainerInfo]) -> dict[str, Lease]:
    """Container id -> its current lease, for the running ones (one short exec each, 8 at a time)."""

    def one(info: ContainerInfo) -> tuple[str, Lease | None]:
        try:
            result = backend.exec(info.id, argv=["cat", LEASE_FILE], user=KEEPER_USER, timeout_s=5)
        except Exception:  # gone or not answering: no lease to show
            return info.id, None
        return info.id, Lease.parse(result.output.decode(errors="replace")) if result.exit_code == 0 else None

    running = [i for i in infos if i.running]
    if not running:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(running))) as pool:
        return {cid: lease for cid, lease in pool.map(one, running) if lease is not None}


def row(info: ContainerInfo, lease: Lease | None = None) -> SandboxRow:
    """One listing row. Run and episode come from the lease (pool sandboxes are created before any
    lease, so their labels are empty), else from the labels (a sandbox created for one episode)."""
    labels = info.labels
    run = lease.run if lease is not None else labels.get(L.RUN, "")
    episode = lease.episode if lease is not None else labels.get(L.EPISODE, "")
    return SandboxRow(
        sandbox_id=info.sandbox_id, container_id=info.id[:12], image=info.image, state=info.state,
        run=run, episode=episode, env=labels.get(L.ENV, ""),
        owner=labels.get(L.OWNER, ""), worker=labels.get(L.WORKER, ""), age_s=round(info.age_s, 1),
        lease_left_s=round(info.lease_expires - time.time(), 1), spec=labels.get(L.SPEC, ""),
    )


def list_sandboxes(
    backend: SandboxBackend, *, run: str | None = None, env: str | None = None,
    state: str | None = None, older_than_s: float | None = None, leases: dict[str, Lease] | None = None,
) -> list[ContainerInfo]:
    """Our containers, newest first, narrowed by run (its lease, else its label), env label, engine
    state and minimum age. Pass `leases` to reuse ones already read (see read_leases)."""
    infos = backend.list(labels=L.label_filter(env=env) or None)
    if run is not None:
        leases = read_leases(backend, infos) if leases is None else leases
        infos = [i for i in infos if (row(i, leases.get(i.id)).run == str(run))]
    if state:
        infos = [i for i in infos if i.state == state]
    if older_than_s is not None:
        infos = [i for i in infos if i.age_s >= older_than_s]
    return sorted(infos, key=lambda i: -i.created_at)


def find_sandbox(backend: SandboxBackend, ref: str) -> ContainerInfo:
    """Resolve our sandbox id, a container name, or a container-id prefix (unambiguous) to one container."""
    infos = backend.list()
    exact = [i for i in infos if ref in (i.sandbox_id, i.id, i.name)]
    matches = exact or [i for i in infos if len(ref) >= 3 and i.id.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise SandboxNotFound(f"sandbox: expected a sandbox id or container-id prefix, got {ref!r} (no match)")
    found = ", ".join(i.sandbox_id for i in matches[:5])
    raise SandboxNotFound(f"sandbox: expected one match for {ref!r}, got {len(matches)} ({found})")


def attach(backend: SandboxBackend, info: ContainerInfo, *, events: EventSink | None = None) -> Sandbox:
    """A Sandbox object for an existing container (its spec comes from the container's labels)."""
    if not info.running:
        raise SandboxError(f"sandbox {info.sandbox_id}: expected a running container, got state {info.state!r}")
    try:
        spec = SandboxSpec.model_validate_json(info.labels[L.SPEC_JSON])
    except (KeyError, ValueError):
        raise SandboxError(f"sandbox {info.sandbox_id}: expected a {L.SPEC_JSON} label, got none") from None
    recorder = EventRecorder(sink=events or NullEventSink(), sandbox_id=info.sandbox_id, worker=None)
    recorder.container_id = info.id
    return Sandbox(
        backend=backend, container_id=info.id, sandbox_id=info.sandbox_id, spec=spec,
        events=recorder, created_at=info.created_at, renew_lease=False,  # the owner keeps the lease
    )


def create_detached(
    backend: SandboxBackend, *, spec: SandboxSpec, env_name: str | None = None,
    events: EventSink | None = None,
) -> Sandbox:
    """A sandbox with no owning process: it lives until its lease (= its lifetime) runs out or `rm`."""
    return create_sandbox(
        backend=backend, spec=spec, events=events, owner=L.Owner.detached(), worker="cli",
        env_name=env_name, lease_ttl_s=spec.max_lifetime_s,
    )


def describe(sandbox: Sandbox, info: ContainerInfo) -> dict[str, Any]:
    lease = sandbox.exec(["cat", LEASE_FILE], timeout_s=10)
    fields = lease.output.decode(errors="replace").split() if lease.exit_code == 0 else []
    return {
        **row(info).as_dict(),
        "container_id": info.id,
        "name": info.name,
        "labels": {k: v for k, v in info.labels.items() if k != L.SPEC_JSON},
        "spec": sandbox.spec.model_dump(mode="json"),
        "lease": dict(zip(("expires", "run", "episode", "state"), fields, strict=False)),
    }


@dataclass(frozen=True, kw_only=True)
class HistoryEntry:
    session: str
    seq: int
    started_at: float
    duration_s: float
    exit_code: int
    status: str
    command: str


def history(sandbox: Sandbox) -> list[HistoryEntry]:
    """Every command run through a shell session since the last reset, oldest first."""
    # The history is root's (the agent can neither read nor forge it): read it as its owner.
    parent, name = HISTORY_DIR.rsplit("/", 1)
    result = sandbox.exec(["tar", "-c", "-C", parent, "-f", "-", "--", name], timeout_s=60, as_control=True)
    if result.exit_code != 0:
        return []
    data = result.output
    entries = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = {m.name.split("/", 1)[-1]: m for m in tar.getmembers() if m.isfile()}

        def read(name: str) -> str:
            member = files.get(name)
            handle = tar.extractfile(member) if member else None
            return handle.read().decode(errors="replace") if handle else ""

        for line in read("index.tsv").splitlines():
            parts = line.split("\t")
            if len(parts) != 6:
                continue
            session, seq, start_us, dur_us, rc, status = parts
            # A ring of 256 commands per session; the slot's first line names the step it holds.
            tag, _, command = read(f"{session}-{int(seq) % 256}.cmd").partition("\n")
            entries.append(HistoryEntry(
                session=session, seq=int(seq), started_at=int(start_us) / 1e6, duration_s=int(dur_us) / 1e6,
                exit_code=int(rc), status=status, command=command if tag == seq else "[no longer kept]",
            ))
    return sorted(entries, key=lambda e: e.started_at)


_DIFF = r"""
cd "$1" 2>/dev/null && [ -d .git ] || { echo "the workspace is not a git repository" >&2; exit 3; }
export GIT_CONFIG_GLOBAL=/dev/null
base=$(cat "$2/head_sha" 2>/dev/null || git rev-parse -q --verify HEAD || git hash-object -t tree /dev/null)
idx=$(mktemp /dev/shm/.crucible-diff-index.XXXXXX) || exit 4
trap 'rm -f "$idx"' EXIT
cp .git/index "$idx" 2>/dev/null || rm -f "$idx"
GIT_INDEX_FILE=$idx git -c core.hooksPath=/dev/null add -A . >/dev/null 2>&1
GIT_INDEX_FILE=$idx git -c core.hooksPath=/dev/null diff --cached --binary "$base"
"""


def workspace_diff(sandbox: Sandbox) -> str:
    """Workspace changes since the baseline (or HEAD), untracked files included; the repo is untouched."""
    result = sandbox.exec(["bash", "-c", _DIFF, "diff", sandbox.spec.workdir, PRISTINE_GIT], timeout_s=120)
    if result.exit_code != 0:
        detail = (result.stderr or result.output).decode(errors="replace").strip()[-300:]
        raise SandboxError(f"diff: expected a git repository in {sandbox.spec.workdir}, got: {detail}")
    return result.output.decode(errors="replace")


def stats(sandbox: Sandbox) -> dict[str, Any]:
    """Engine stats plus the fill level of every tmpfs."""
    data = sandbox.backend.stats(sandbox.container_id)
    spec = sandbox.spec
    df = sandbox.exec(["df", "-B1", "--output=target,used,size", spec.workdir, "/tmp", spec.home], timeout_s=10)
    disks = {}
    for line in df.output.decode(errors="replace").splitlines()[1:]:
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():
            disks[parts[0]] = {"used_bytes": int(parts[1]), "size_bytes": int(parts[2])}
    return {**data, "tmpfs": disks}


def remove(backend: SandboxBackend, infos: list[ContainerInfo], *, dry_run: bool = False) -> list[str]:
    """Remove containers (idempotent); returns the sandbox ids removed (or that would be)."""
    removed = []
    for info in infos:
        if not dry_run:
            backend.remove(info.id)
        removed.append(info.sandbox_id)
    return removed


def prune(backend: SandboxBackend, *, dry_run: bool = False, events: EventSink | None = None) -> list[Verdict]:
    """One reaper sweep: orphans (dead owner), expired leases, stopped containers."""
    return Reaper(backend=backend, events=events).sweep(dry_run=dry_run)
