"""The reaper: orphans of a SIGKILLed owner go in one sweep; leases decide for everyone else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandboxes import InMemoryEventSink, Reaper, SandboxBackend, SandboxSpec, create_sandbox
from sandboxes.labels import Owner

# Sweeps, or runs a worker whose reaper sweeps, every crucible container on the machine: one xdist worker runs all of these.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]

ROOT = Path(__file__).resolve().parents[2]

OWNER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from sandboxes import SandboxPool, SandboxSpec, make_backend
    spec = SandboxSpec.model_validate_json(sys.argv[1])
    pool = SandboxPool(spec=spec, backend=make_backend(), min_size=2, max_size=3)
    pool.wait_ready(timeout_s=120)
    sandbox = pool.acquire(run_id=7, episode_id=8)
    sandbox.step("sleep 600 &")  # mid-episode
    pool.wait_ready(idle=2, timeout_s=120)
    ids = [sandbox.container_id] + [s.container_id for s in pool._idle]
    print("READY " + " ".join(ids), flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_owner_is_reaped_in_one_sweep(backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, base_spec.model_dump_json()],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        ids = line.split()[1:]
        assert len(ids) == 3
        assert all(backend.get(cid) is not None for cid in ids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    sink = InMemoryEventSink()
    # Another process's reaper on this machine may get to some first; whatever is left goes in ONE sweep.
    present = [cid for cid in ids if backend.get(cid) is not None]
    verdicts = Reaper(backend=backend, events=sink).sweep()
    reaped = {v.container_id: v.reason for v in verdicts}
    assert {cid: reaped.get(cid) for cid in present} == {cid: "owner_dead" for cid in present}
    assert all(backend.get(cid) is None for cid in ids)
    assert sink.kinds().count("reap") >= len(present)
    assert not {v.container_id for v in Reaper(backend=backend).sweep()} & set(ids)  # nothing left to do


def test_leases_decide_for_owners_the_reaper_cannot_check(backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    elsewhere = Owner(host="another-host", pid=1, start=1)  # liveness unknowable from here
    expired = create_sandbox(backend=backend, spec=base_spec, owner=elsewhere, lease_ttl_s=0)
    renewed = create_sandbox(backend=backend, spec=base_spec, owner=elsewhere, lease_ttl_s=0)
    fresh = create_sandbox(backend=backend, spec=base_spec, owner=elsewhere, lease_ttl_s=600)
    mine = create_sandbox(backend=backend, spec=base_spec, lease_ttl_s=600)
    try:
        renewed.lease_ttl_s = 600
        assert renewed.write_lease()  # the label is stale but the lease file was renewed
        reaper = Reaper(backend=backend)

        def judged(container_id: str) -> str | None:
            info = backend.get(container_id)
            return "gone" if info is None else reaper.judge(info)  # "gone": another reaper was faster

        assert judged(expired.container_id) in ("lease_expired", "gone")
        assert [judged(s.container_id) for s in (renewed, fresh, mine)] == [None, None, None]
        verdicts = {v.container_id: v.reason for v in reaper.sweep()}
        assert verdicts.get(expired.container_id, "lease_expired") == "lease_expired"
        for kept in (renewed, fresh, mine):
            assert kept.container_id not in verdicts
            assert kept.step("echo alive").stdout == "alive\n"
        assert backend.get(expired.container_id) is None
    finally:
        for sandbox in (expired, renewed, fresh, mine):
            sandbox.destroy()


def test_destroy_is_idempotent(backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    sink = InMemoryEventSink()
    sandbox = create_sandbox(backend=backend, spec=base_spec, events=sink)
    sandbox.destroy()
    sandbox.destroy()
    assert backend.remove(sandbox.container_id) is False
    assert sink.kinds() == ["create", "destroy"]
