"""SandboxPool: warm sandboxes for one spec, refilled in the background.

    with SandboxPool(spec=spec, backend=backend, min_size=2, max_size=8) as pool:
        with pool.lease(run_id=1, episode_id=7) as sandbox:
            sandbox.step("make test")

`acquire` takes a warm sandbox when one is idle (no create on that path); only an empty pool with
room creates inline. `release` hands the sandbox to a background worker that resets it, checks its
health and puts it back — or retires it: after `max_uses` episodes, after an OOM, on a failed reset
or health check, or when too little of its lifetime is left. Every method is thread-safe; `close()`
destroys everything the pool owns, leased sandboxes included.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from sandboxes.backend import ImageSource, SandboxBackend
from sandboxes.create import create_sandbox
from sandboxes.errors import AcquireTimeout, PoolClosed, SandboxDead
from sandboxes.events import EventKind, EventSink, NullEventSink
from sandboxes.labels import Owner
from sandboxes.sandbox import DEFAULT_LEASE_TTL_S, Sandbox
from sandboxes.spec import SandboxSpec

CREATE_ATTEMPTS = 2
"""Inline creates: a sandbox that never became ready is replaced once (`_create_inline`)."""
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PoolStats:
    idle: int
    leased: int
    creating: int
    recycling: int
    created: int
    retired: int
    warm_acquires: int
    cold_acquires: int


class SandboxPool:
    """Warm sandboxes of one spec (min_size kept idle, at most max_size owned)."""

    def __init__(
        self,
        *,
        spec: SandboxSpec,
        backend: SandboxBackend,
        events: EventSink | None = None,
        min_size: int = 1,
        max_size: int = 8,
        max_uses: int = 50,
        workers: int = 2,
        owner: Owner | None = None,
        worker: str | None = None,
        run_id: int | None = None,
        env_name: str | None = None,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        min_remaining_life_s: float | None = None,
        start: bool = True,
        pools: str | None = None,
        images: ImageSource | None = None,
    ) -> None:
        if not 0 <= min_size <= max_size or max_size < 1:
            raise ValueError(f"pool size: expected 0 <= min_size <= max_size and max_size >= 1, got {min_size}..{max_size}")
        self.spec = spec
        self.min_size, self.max_size, self.max_uses = min_size, max_size, max_uses
        self._events = events or NullEventSink()
        self._create_one = functools.partial(
            create_sandbox, backend=backend, spec=spec, events=self._events, owner=owner or Owner.current(),
            worker=worker, run_id=run_id, env_name=env_name, lease_ttl_s=lease_ttl_s, pools=pools, images=images,
        )
        self._min_life = spec.max_lifetime_s * 0.25 if min_remaining_life_s is None else min_remaining_life_s
        self._lease_ttl_s = lease_ttl_s
        self._cond = threading.Condition()
        self._idle: deque[Sandbox] = deque()
        self._leased: dict[str, Sandbox] = {}
        self._creating = self._recycling = 0
        self._counts = {"created": 0, "retired": 0, "warm": 0, "cold": 0}
        self._closed = False
        self._failures = 0
        self._backoff_until = 0.0
        self._workers = max(1, workers)
        self._executor = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="sandbox-pool")
        self._maintainer = threading.Thread(target=self._maintain, name="sandbox-pool-refill", daemon=True)
        if start:
            self._maintainer.start()

    # -- public ---------------------------------------------------------------------------------
    def acquire(self, *, run_id: int | None = None, episode_id: int | None = None,
                timeout_s: float | None = None) -> Sandbox:
        """A ready sandbox leased to (run_id, episode_id). Raises AcquireTimeout or PoolClosed."""
        started = time.perf_counter()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            sandbox = self._take_idle_or_reserve(deadline, timeout_s)
            warm = sandbox is not None
            if sandbox is None:
                sandbox = self._create_reserved()
            if sandbox.assign(run_id=run_id, episode_id=episode_id):
                break
            self._forget_leased(sandbox)  # died while idle (lifetime, reaped): replace it
            self._retire(sandbox, "dead_on_acquire")
        with self._cond:
            self._counts["warm" if warm else "cold"] += 1
        sandbox.events.emit(EventKind.ACQUIRE, duration_s=time.perf_counter() - started, warm=warm, uses=sandbox.uses)
        return sandbox

    def release(self, sandbox: Sandbox, *, discard: bool = False) -> None:
        """Give a sandbox back; it is reset and re-pooled (or retired) in the background."""
        if not self._forget_leased(sandbox):
            log.warning("release of %s, which this pool does not hold as leased; ignoring", sandbox.id)
            return
        sandbox.events.emit(EventKind.RELEASE, uses=sandbox.uses, discard=discard or None)
        sandbox.unassign()
        with self._cond:
            closed = self._closed
            if not closed:
                self._recycling += 1
        if not closed:
            try:
                self._executor.submit(self._recycle, sandbox, discard)
                return
            except RuntimeError:  # closed since: its executor takes no more work
                with self._cond:
                    self._recycling -= 1
        self._retire(sandbox, "pool_closed")

    @contextmanager
    def lease(self, *, run_id: int | None = None, episode_id: int | None = None,
              timeout_s: float | None = None) -> Iterator[Sandbox]:
        sandbox = self.acquire(run_id=run_id, episode_id=episode_id, timeout_s=timeout_s)
        try:
            yield sandbox
        finally:
            self.release(sandbox)

    @contextmanager
    def open_fresh(self) -> Iterator[Sandbox]:
        """A brand-new sandbox outside the pool (e.g. to grade a diff untouched by the agent). PoolClosed on a
        closed pool, whose close would never see it."""
        with self._cond:
            if self._closed:
                raise PoolClosed(f"pool for {self.spec.image}: expected an open pool, got a closed one")
        sandbox = self._create_inline()
        try:
            yield sandbox
        finally:
            sandbox.destroy(reason="fresh_done")

    def stats(self) -> PoolStats:
        with self._cond:
            return PoolStats(
                idle=len(self._idle), leased=len(self._leased), creating=self._creating,
                recycling=self._recycling, created=self._counts["created"], retired=self._counts["retired"],
                warm_acquires=self._counts["warm"], cold_acquires=self._counts["cold"],
            )

    def wait_ready(self, *, idle: int | None = None, timeout_s: float = 60.0) -> bool:
        """Block until at least `idle` (default min_size) sandboxes are idle; False after `timeout_s`."""
        want = self.min_size if idle is None else idle
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self._idle) < want:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self) -> None:
        """Destroy every sandbox this pool owns (idle and leased) and stop its threads."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            owned = list(self._idle) + list(self._leased.values())
            self._idle.clear()
            self._leased.clear()
            self._cond.notify_all()
        if self._maintainer.is_alive():
            self._maintainer.join()
        self._executor.shutdown(wait=True)  # in-flight creates/recycles see `closed` and destroy
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda sb: self._retire(sb, "pool_closed"), owned))

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------
    def _total(self) -> int:
        return len(self._idle) + len(self._leased) + self._creating + self._recycling

    def _take_idle_or_reserve(self, deadline: float | None, timeout_s: float | None) -> Sandbox | None:
        """Pop a usable idle sandbox (None = a create slot was reserved for the caller)."""
        stale: list[Sandbox] = []
        try:
            with self._cond:
                while True:
                    if self._closed:
                        raise PoolClosed(f"pool for {self.spec.image}: expected an open pool, got a closed one")
                    while self._idle:
                        sandbox = self._idle.popleft()
                        if self.spec.max_lifetime_s - sandbox.age_s < self._min_life:
                            stale.append(sandbox)
                            continue
                        self._leased[sandbox.id] = sandbox
                        return sandbox
                    if self._total() < self.max_size:
                        self._creating += 1
                        return None
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise AcquireTimeout(
                            f"acquire: expected a free sandbox within {timeout_s}s, got none "
                            f"({self.max_size} of max_size {self.max_size} in use)"
                        )
                    self._cond.wait(remaining)
        finally:
            for sandbox in stale:
                try:
                    self._executor.submit(self._retire, sandbox, "lifetime")
                except RuntimeError:  # the pool closed meanwhile: retire here
                    self._retire(sandbox, "lifetime")

    def _create_inline(self) -> Sandbox:
        """A new sandbox for a caller that waits on it: one whose shell did not come up (SandboxDead; it is
        destroyed already) is replaced once, since on a loaded host a driver can miss its start deadline
        and the episode waiting on it should not pay for that. A second failure is raised: then the image
        or the host is at fault. (The background refill backs off and retries on its own.)"""
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                return self._create_one()
            except SandboxDead as error:
                if attempt == CREATE_ATTEMPTS:
                    raise
                log.warning("a new %s sandbox never became ready (%s); creating another", self.spec.image, error)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _create_reserved(self) -> Sandbox:
        sandbox: Sandbox | None = None
        try:
            sandbox = self._create_inline()
            return sandbox
        finally:
            with self._cond:
                self._creating -= 1
                if sandbox is not None:
                    self._counts["created"] += 1
                    self._leased[sandbox.id] = sandbox
                self._cond.notify_all()

    def _forget_leased(self, sandbox: Sandbox) -> bool:
        with self._cond:
            found = self._leased.pop(sandbox.id, None) is not None
            self._cond.notify_all()
            return found

    def _retire_reason(self, sandbox: Sandbox, discard: bool) -> str | None:
        if discard:
            return "discarded"
        if sandbox.saw_oom:
            return "oom"
        if not sandbox.healthy or sandbox.destroyed:
            return "unhealthy"
        if sandbox.uses >= self.max_uses:
            return "max_uses"
        if self.spec.max_lifetime_s - sandbox.age_s < self._min_life:
            return "lifetime"
        return None

    def _recycle(self, sandbox: Sandbox, discard: bool) -> None:
        reason = self._retire_reason(sandbox, discard)
        try:
            if reason is None:
                sandbox.write_lease(state="recycling")  # held by no run from now on (the control service reads it)
                reason = self._reset_and_check(sandbox)
        finally:
            with self._cond:
                self._recycling -= 1
                keep = reason is None and not self._closed
                if keep:
                    self._idle.append(sandbox)
                self._cond.notify_all()
            if not keep:
                self._retire(sandbox, reason or "pool_closed")

    def _reset_and_check(self, sandbox: Sandbox) -> str | None:
        try:
            sandbox.reset()
        except Exception as error:  # ResetFailed, or the engine failing under us: replace either way
            log.info("reset of %s failed: %s", sandbox.id, error)
            return "reset_failed"
        if not sandbox.health_check():
            return "health_fail"
        return None if sandbox.write_lease(state="idle") else "health_fail"

    def _retire(self, sandbox: Sandbox, reason: str) -> None:
        with self._cond:
            self._counts["retired"] += 1
        sandbox.events.emit(EventKind.RETIRE, reason=reason, uses=sandbox.uses)
        try:
            sandbox.destroy(reason=reason)
        except Exception:  # the reaper removes whatever survives
            log.exception("could not destroy %s", sandbox.id)

    def _maintain(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                deficit = self.min_size - (len(self._idle) + self._creating + self._recycling)
                room = self.max_size - self._total()
                wanted = 0 if time.monotonic() < self._backoff_until else min(deficit, room, self._workers - self._creating)
                wanted = max(0, wanted)
                self._creating += wanted
            for _ in range(wanted):
                self._executor.submit(self._refill_one)
            self._renew_idle_leases()
            with self._cond:
                if not self._closed:
                    self._cond.wait(timeout=1.0)

    def _refill_one(self) -> None:
        sandbox: Sandbox | None = None
        try:
            sandbox = self._create_one()
            self._failures = 0
        except Exception as error:
            self._failures += 1
            self._backoff_until = time.monotonic() + min(30.0, 0.5 * 2**self._failures)
            log.warning("could not create a sandbox for %s (%d in a row): %s", self.spec.image, self._failures, error)
        finally:
            with self._cond:
                self._creating -= 1
                keep = sandbox is not None and not self._closed
                if sandbox is not None:
                    self._counts["created"] += 1
                if keep and sandbox is not None:
                    self._idle.append(sandbox)
                self._cond.notify_all()
        if sandbox is not None and not keep:
            self._retire(sandbox, "pool_closed")

    def _renew_idle_leases(self) -> None:
        with self._cond:
            idle = list(self._idle)
        for sandbox in idle:
            if sandbox.lease_due:
                sandbox.write_lease(state="idle")
