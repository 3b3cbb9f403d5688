"""A set of warm pools, one per distinct sandbox spec (equal specs share a pool), for a process that runs
sandboxes of several environments: a task worker, the OpenEnv server, the CLI's factory and calibration
(environments.sandboxes.DockerSandboxes holds one)."""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sandboxes.backend import SandboxBackend
from sandboxes.errors import PoolClosed
from sandboxes.labels import POOLS
from sandboxes.pool import SandboxPool
from sandboxes.sandbox import Sandbox
from sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)
SWEEP_PASSES = 3
"""Lists of the set's leftover containers at close (each removed, each in-progress removal waited for)."""


class PoolSet:
    """One pool per distinct spec (equal specs share a pool), created on first use. Every sandbox its pools
    make carries this set's id (label POOLS), so that `close` leaves no container of it behind, whichever
    path one escaped its pool by (a destroy the engine refused, a create cut short)."""

    def __init__(self, *, backend: SandboxBackend, **pool_options: Any) -> None:
        self._backend = backend
        self.id = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._options = {**pool_options, "pools": self.id}
        self._lock = threading.Lock()
        self._pools: dict[SandboxSpec, SandboxPool] = {}
        self._closed = False

    def pool(self, spec: SandboxSpec) -> SandboxPool:
        """The pool of `spec`, made on first use. PoolClosed once the set is closed: a straggler (a thread the
        caller did not join, a request served during shutdown) can never start a pool nobody will close."""
        with self._lock:
            self._refuse_if_closed()
            pool = self._pools.get(spec)
            if pool is None:
                pool = self._pools[spec] = SandboxPool(spec=spec, backend=self._backend, **self._options)
            return pool

    @contextmanager
    def fresh(self, spec: SandboxSpec) -> Iterator[Sandbox]:
        """A sandbox of `spec` outside every pool, destroyed when done: for images too many or too rarely
        used to keep warm (a task's own image: SWE-bench ships one per instance)."""
        with self._lock:
            self._refuse_if_closed()
        pool = SandboxPool(spec=spec, backend=self._backend, **{**self._options, "min_size": 0, "start": False})
        try:
            with pool.open_fresh() as sandbox:
                yield sandbox
        finally:
            pool.close()

    def close(self) -> None:
        """Close every pool, then remove any container of this set that is still there, listing again until
        none is (a removal the engine reports in progress is waited for, within SWEEP_PASSES lists)."""
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        for _ in range(SWEEP_PASSES):
            try:
                left = self._backend.list(labels={POOLS: self.id})
            except Exception:  # a slow engine: list again; a gone one: the reaper removes what survives
                log.exception("could not list the containers of pool set %s", self.id)
                continue
            if not left:
                return
            for info in left:
                log.warning("pool set %s: %s (%s) outlived its pool; removing it", self.id, info.sandbox_id, info.state)
                try:
                    self._backend.remove(info.id)
                except Exception:
                    log.exception("could not remove %s", info.sandbox_id)
        log.error("pool set %s: containers still listed after %d sweeps; the reaper removes them", self.id,
                  SWEEP_PASSES)

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise PoolClosed(f"pool set {self.id}: expected an open pool set, got a closed one")
