"""Container labels and owner identity: what lets any process find, attribute and reap our containers.

Owner ids are `host:pid:start` where `start` is the process start time in clock ticks since boot
(/proc/<pid>/stat field 22), so a recycled pid never passes for its dead predecessor. Sandboxes made
by the CLI have no live owner (`host:detached:0`) and live by their lease alone, once their creator
has written it: the `creator` label names the process that made them, so the reaper can tell a
sandbox whose creation was cut short (creator gone, no lease yet) from one that is ready.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

PREFIX = "crucible."
OWNER = "crucible.owner"
WORKER = "crucible.worker"
LEASE_EXPIRES = "crucible.lease_expires"
RUN = "crucible.run"
EPISODE = "crucible.episode"
ENV = "crucible.env"
SPEC = "crucible.spec"
SPEC_JSON = "crucible.spec_json"
SANDBOX_ID = "crucible.sandbox_id"
CREATED = "crucible.created"
CREATOR = "crucible.creator"  # the process that made it (for a detached sandbox: not its owner)
POOLS = "crucible.pools"  # the PoolSet that made it: its close removes every container so labelled

DETACHED = "detached"


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])  # field 22 overall; fields[0] is field 3


@dataclass(frozen=True)
class Owner:
    """Who owns a container: a live process on some host, or nobody (detached)."""

    host: str
    pid: int | None
    start: int | None

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(host=socket.gethostname(), pid=pid, start=process_start_ticks(pid))

    @classmethod
    def detached(cls) -> Owner:
        return cls(host=socket.gethostname(), pid=None, start=None)

    @classmethod
    def parse(cls, value: str) -> Owner:
        host, _, rest = value.rpartition(":")
        host, _, pid = host.rpartition(":")
        if not pid.isdigit() or not rest.isdigit():
            return cls(host=host or value, pid=None, start=None)
        return cls(host=host, pid=int(pid), start=int(rest))

    def __str__(self) -> str:
        if self.pid is None:
            return f"{self.host}:{DETACHED}:0"
        return f"{self.host}:{self.pid}:{self.start or 0}"

    def is_alive(self) -> bool | None:
        """True/False for a process on this host; None when we cannot tell (other host, detached)."""
        if self.pid is None or self.host != socket.gethostname():
            return None
        start = process_start_ticks(self.pid)
        return start is not None and (self.start in (None, 0) or start == self.start)


def label_filter(**values: str | int | None) -> dict[str, str]:
    """`label_filter(run=3)` -> {"crucible.run": "3"}; None values are left out."""
    return {PREFIX + k: str(v) for k, v in values.items() if v is not None}
