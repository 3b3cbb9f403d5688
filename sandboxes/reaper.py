"""Reaper: remove containers nobody will ever clean up. Run at worker start and on a schedule.

A container of ours (label crucible.owner) is reaped when
  1. it is not running (its lifetime ended, it crashed, or it was never started), or
  2. its owner is a process on this host that is gone (pid missing, or a different start time), or
  3. it is detached (made by the CLI), the process that created it is gone, and it has no lease file:
     its creation was cut short (a SIGKILLed `crucible sandbox create`); a finished creation writes
     the lease before it returns, or
  4. its lease expired: the label's expiry has passed and so has the renewable one in
     /run/crucible/lease (read only for such candidates; unreadable counts as expired).
Owners on other hosts are judged by rules 1 and 4 alone.
Removal is idempotent, so concurrent reapers on one host are harmless.

    reaper = start_reaper(backend=make_backend(), events=sink)   # sweep now, then every 30 s
    reaper.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sandboxes.backend import ContainerInfo, SandboxBackend
from sandboxes.errors import SandboxError
from sandboxes.events import EventKind, EventRecorder, EventSink, NullEventSink
from sandboxes.labels import CREATOR, WORKER, Owner
from sandboxes.layout import KEEPER_USER, LEASE_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    container_id: str
    sandbox_id: str
    reason: str  # not_running | owner_dead | creator_dead | lease_expired
    owner: str
    removed: bool = False


class Reaper:
    """Finds and removes orphaned or expired sandbox containers."""

    def __init__(self, *, backend: SandboxBackend, events: EventSink | None = None, worker: str | None = None) -> None:
        self.backend = backend
        self.events = events or NullEventSink()
        self.worker = worker
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def judge(self, info: ContainerInfo, *, now: float | None = None) -> str | None:
        """Why `info` should be reaped, or None to keep it."""
        now = time.time() if now is None else now
        if info.state == "removing":
            return None
        alive = info.owner.is_alive()
        creator = Owner.parse(info.labels[CREATOR]).is_alive() if info.labels.get(CREATOR) else None
        if info.state == "created" and alive is not False and creator is not False and info.age_s < 120:
            return None  # being started right now by its owner
        if not info.running:
            return "not_running"
        if alive is False:
            return "owner_dead"
        if info.owner.pid is None and creator is False and self._has_lease(info) is False:
            return "creator_dead"
        if info.lease_expires > now:
            return None
        lease = self._read_lease(info)
        return None if lease is not None and lease > now else "lease_expired"

    def sweep(self, *, labels: Mapping[str, str] | None = None, dry_run: bool = False) -> list[Verdict]:
        """One pass over our containers (optionally narrowed by labels); returns what it reaped."""
        verdicts = []
        now = time.time()
        for info in self.backend.list(labels=labels):
            reason = self.judge(info, now=now)
            if reason is None:
                continue
            verdict = Verdict(container_id=info.id, sandbox_id=info.sandbox_id, reason=reason, owner=str(info.owner))
            if not dry_run:
                verdict = self._reap(info, verdict)
            verdicts.append(verdict)
        return verdicts

    def _reap(self, info: ContainerInfo, verdict: Verdict) -> Verdict:
        recorder = EventRecorder(sink=self.events, sandbox_id=info.sandbox_id, worker=self.worker)
        recorder.container_id = info.id
        started = time.perf_counter()
        try:
            removed = self.backend.remove(info.id)
        except SandboxError as error:
            log.warning("could not reap %s: %s", info.id[:12], error)
            return verdict
        except Exception:
            log.exception("could not reap %s", info.id[:12])
            return verdict
        recorder.emit(
            EventKind.REAP, duration_s=time.perf_counter() - started, reason=verdict.reason,
            owner=verdict.owner, owner_worker=info.labels.get(WORKER) or None, removed=removed,
        )
        log.info("reaped %s (%s, owner %s)", info.sandbox_id, verdict.reason, verdict.owner)
        return Verdict(**{**verdict.__dict__, "removed": True})

    def _has_lease(self, info: ContainerInfo) -> bool | None:
        """Whether the lease file exists; None when we cannot tell (then nothing is removed for it)."""
        try:
            result = self.backend.exec(info.id, argv=["test", "-e", LEASE_FILE], user=KEEPER_USER, timeout_s=5)
        except Exception:
            return None
        return {0: True, 1: False}.get(result.exit_code)

    def _read_lease(self, info: ContainerInfo) -> float | None:
        try:
            result = self.backend.exec(info.id, argv=["cat", LEASE_FILE], user=KEEPER_USER, timeout_s=5)
        except Exception:  # cannot even start a process: treat as expired
            return None
        try:
            return float(result.output.split()[0]) if result.exit_code == 0 else None
        except (IndexError, ValueError):
            return None

    def start(self, *, interval_s: float = 30.0) -> None:
        """Sweep now and then every `interval_s` in a daemon thread until `stop()`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="sandbox-reaper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self, interval_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.sweep()
            except Exception:  # an engine hiccup must not end the schedule
                log.exception("reaper sweep failed")
            self._stop.wait(interval_s)


def start_reaper(
    *, backend: SandboxBackend, events: EventSink | None = None, worker: str | None = None, interval_s: float = 30.0
) -> Reaper:
    """Worker start: one sweep now (so a crashed predecessor's containers go first), then on a schedule."""
    reaper = Reaper(backend=backend, events=events, worker=worker)
    try:
        reaper.sweep()
    except Exception:  # an engine hiccup at start must not stop the worker; the schedule retries
        log.exception("initial reaper sweep failed")
    reaper.start(interval_s=interval_s)
    return reaper
