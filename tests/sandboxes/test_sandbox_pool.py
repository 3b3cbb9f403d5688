"""The warm pool: refill, warm acquire, retirement rules, thread safety, close."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from sandboxes import (
    AcquireTimeout,
    InMemoryEventSink,
    PoolClosed,
    PoolSet,
    SandboxBackend,
    SandboxPool,
    SandboxSpec,
    StepStatus,
)
from sandboxes.labels import POOLS
from tests.support.polling import wait_for

pytestmark = pytest.mark.docker


def retire_reasons(sink: InMemoryEventSink, sandbox_id: str) -> list[str]:
    return [e.detail["reason"] for e in sink.events if e.sandbox_id == sandbox_id and e.kind == "retire"]


def settled(pool: SandboxPool) -> bool:
    stats = pool.stats()
    return stats.recycling == 0 and stats.creating == 0


@pytest.fixture
def make_pool(backend: SandboxBackend, base_spec: SandboxSpec, events: InMemoryEventSink) -> Iterator:
    pools: list[SandboxPool] = []

    def make(**options: object) -> SandboxPool:
        options = {"spec": base_spec, "backend": backend, "events": events, **options}
        pool = SandboxPool(**options)  # type: ignore[arg-type]
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def test_refills_to_min_size_and_acquires_warm(make_pool, events: InMemoryEventSink) -> None:
    pool = make_pool(min_size=2, max_size=3)
    assert pool.wait_ready(timeout_s=60)
    warm_ids = {s.id for s in pool._idle}
    sandbox = pool.acquire(run_id=None, episode_id=None)
    assert sandbox.id in warm_ids  # handed out from the warm set, no create on this path
    acquire = [e for e in events.events if e.kind == "acquire"][-1]
    assert acquire.detail["warm"] is True and acquire.duration_ms is not None
    assert sandbox.step("echo warm").stdout == "warm\n"
    wait_for(lambda: pool.stats().idle == 2, what="the pool to refill behind the lease")
    pool.release(sandbox)
    wait_for(lambda: settled(pool), what="recycling")
    assert pool.stats().idle == 3
    kinds = events.kinds(sandbox.id)
    assert kinds[:3] == ["create", "acquire", "release"] and "reset" in kinds


def test_a_sandbox_is_retired_after_max_uses(make_pool, events: InMemoryEventSink) -> None:
    pool = make_pool(min_size=1, max_size=1, max_uses=2)
    first = pool.acquire()
    pool.release(first)
    wait_for(lambda: settled(pool) and pool.stats().idle == 1, what="recycling")
    again = pool.acquire()
    assert again is first and again.uses == 2
    pool.release(again)
    third = pool.acquire(timeout_s=60)
    assert third.id != first.id
    assert retire_reasons(events, first.id) == ["max_uses"]
    assert first.destroyed
    pool.release(third)


def test_dead_sandbox_is_retired_and_replaced(make_pool, backend: SandboxBackend, events: InMemoryEventSink) -> None:
    pool = make_pool(min_size=1, max_size=2)
    sandbox = pool.acquire()
    backend.remove(sandbox.container_id)  # the engine loses it mid-episode
    result = sandbox.step("echo hi")
    assert result.status is StepStatus.SANDBOX_DEAD and not sandbox.healthy
    assert not sandbox.health_check()
    assert "health_fail" in events.kinds(sandbox.id)
    pool.release(sandbox)
    wait_for(lambda: settled(pool), what="retirement")
    assert retire_reasons(events, sandbox.id) == ["unhealthy"]
    with pool.lease(timeout_s=60) as fresh:
        assert fresh.health_check()


def test_idle_sandbox_that_died_is_skipped_on_acquire(make_pool, backend: SandboxBackend) -> None:
    pool = make_pool(min_size=1, max_size=2)
    assert pool.wait_ready(timeout_s=60)
    victim = pool._idle[0]
    backend.remove(victim.container_id)
    sandbox = pool.acquire(timeout_s=60)
    assert sandbox.id != victim.id and sandbox.step("true").exit_code == 0
    pool.release(sandbox)


def test_failed_reset_retires(make_pool, repo_spec: SandboxSpec, events: InMemoryEventSink) -> None:
    pool = make_pool(spec=repo_spec, min_size=1, max_size=1)
    sandbox = pool.acquire(timeout_s=60)
    assert sandbox.is_repo
    sandbox.step("rm -rf .git")
    pool.release(sandbox)
    fresh = pool.acquire(timeout_s=60)
    assert retire_reasons(events, sandbox.id) == ["reset_failed"]
    assert fresh.step("git status --porcelain && git log --format=%s").stdout == "seed\n"
    pool.release(fresh)


def test_acquire_times_out_when_full_and_close_stops_it(make_pool) -> None:
    pool = make_pool(min_size=0, max_size=1)
    held = pool.acquire(timeout_s=60)
    with pytest.raises(AcquireTimeout, match=r"expected a free sandbox within 0\.2s"):
        pool.acquire(timeout_s=0.2)
    pool.close()
    assert held.destroyed  # close destroys leased sandboxes too
    with pytest.raises(PoolClosed):
        pool.acquire()


def test_concurrent_leases(make_pool, backend: SandboxBackend) -> None:
    pool = make_pool(min_size=1, max_size=2)
    lock = threading.Lock()
    held: set[str] = set()
    seen: set[str] = set()
    peak = 0
    errors: list[BaseException] = []

    def episode(n: int) -> None:
        nonlocal peak
        try:
            for _ in range(3):
                with pool.lease(run_id=1, episode_id=n, timeout_s=120) as sandbox:
                    with lock:
                        assert sandbox.id not in held  # never leased twice at once
                        held.add(sandbox.id)
                        seen.add(sandbox.id)
                        peak = max(peak, len(held))
                    assert sandbox.step(f"echo {n}").stdout == f"{n}\n"
                    with lock:
                        held.discard(sandbox.id)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=episode, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert 1 <= peak <= 2
    pool.close()
    assert seen and not [i for i in backend.list() if i.sandbox_id in seen]


def test_pool_set_shares_a_pool_between_equal_specs(backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    pools = PoolSet(backend=backend, min_size=0, max_size=1)
    try:
        same = base_spec.model_copy(update={"memory": base_spec.memory})
        assert pools.pool(base_spec) is pools.pool(same)
        assert pools.pool(base_spec) is not pools.pool(base_spec.model_copy(update={"cpus": 0.5}))
    finally:
        pools.close()


def test_a_closed_pool_set_makes_no_pool_and_a_closed_pool_no_fresh_sandbox(
        backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    """A straggler that asks after close (a thread its owner did not join, a request served during shutdown)
    is refused: a pool made then, or a fresh sandbox of a closed pool, would be one nobody closes."""
    pools = PoolSet(backend=backend, min_size=0, max_size=1)
    pool = pools.pool(base_spec)
    pools.close()
    with pytest.raises(PoolClosed, match="expected an open pool set, got a closed one"):
        pools.pool(base_spec)
    with pytest.raises(PoolClosed, match="expected an open pool set"), pools.fresh(base_spec):
        pass
    with pytest.raises(PoolClosed, match="expected an open pool, got a closed one"), pool.open_fresh():
        pass
    assert pool.stats().created == 0 and backend.list(labels={POOLS: pools.id}) == []


def test_a_closed_pool_set_leaves_no_container_even_one_the_engine_would_not_remove(
        backend: SandboxBackend, base_spec: SandboxSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's own retire fails (the engine refuses the removal once, as a loaded dockerd can); the set's
    close finds the container by its label and removes it. Another set in the same process, with the same
    worker name, keeps its sandboxes."""
    from docker.errors import APIError

    leaking = PoolSet(backend=backend, worker="same", min_size=1, max_size=2)
    other = PoolSet(backend=backend, worker="same", min_size=0, max_size=1)
    try:
        pool = leaking.pool(base_spec)
        assert pool.wait_ready(timeout_s=120)
        kept = other.pool(base_spec).acquire()
        leased = pool.acquire()
        ours = {info.sandbox_id for info in backend.list(labels={POOLS: leaking.id})}
        assert leased.id in ours and kept.id not in ours
        real_remove, refused = backend.remove, []

        def remove(container_id: str) -> bool:
            if not refused:
                refused.append(container_id)
                raise APIError("tried to kill container, but did not receive an exit event")
            return real_remove(container_id)

        monkeypatch.setattr(backend, "remove", remove)
        leaking.close()
        assert refused  # the pool's own destroy failed for one of them
        assert backend.list(labels={POOLS: leaking.id}) == []
        assert kept.step("echo alive").stdout.strip() == "alive"  # the other set's sandbox is untouched
    finally:
        monkeypatch.undo()
        leaking.close()
        other.close()
    assert backend.list(labels={POOLS: other.id}) == []


def _failing_first(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[str]:
    """Make the pool's first `failures` creates behave as a sandbox whose shell missed its start deadline on
    a loaded host: the real container is created, then destroyed, and SandboxDead raised (as
    create_sandbox does). Returns the ids created, in order."""
    from sandboxes import pool as pool_module
    from sandboxes.errors import SandboxDead

    real = pool_module.create_sandbox
    created: list[str] = []

    def create(**kwargs: object) -> object:
        sandbox = real(**kwargs)  # type: ignore[arg-type]
        created.append(sandbox.id)
        if len(created) <= failures:
            sandbox.destroy(reason="create_failed: SessionError")
            raise SandboxDead(f"sandbox {sandbox.id}: expected a ready shell, got shell session: expected a reply "
                              "before the deadline, got none")
        return sandbox

    monkeypatch.setattr(pool_module, "create_sandbox", create)
    return created


def test_a_sandbox_that_never_became_ready_is_replaced_once(make_pool, monkeypatch: pytest.MonkeyPatch,
                                                             backend: SandboxBackend) -> None:
    created = _failing_first(monkeypatch, failures=1)
    pool = make_pool(min_size=0, max_size=2)
    with pool.lease(run_id=None, episode_id=None) as sandbox:
        assert sandbox.step("echo up").stdout == "up\n"
        assert created == [created[0], sandbox.id]  # the first one failed, the second is the one handed out
    with pool.open_fresh() as fresh:  # the grader's fresh sandbox: the same rule
        assert fresh.step("echo fresh").stdout == "fresh\n"
    assert backend.list(labels={"crucible.sandbox_id": created[0]}) == []  # nothing of the failed one is left


def test_a_second_failure_is_raised(make_pool, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxes.errors import SandboxDead

    created = _failing_first(monkeypatch, failures=2)
    pool = make_pool(min_size=0, max_size=2)
    with pytest.raises(SandboxDead, match="expected a ready shell"):
        pool.acquire(run_id=None, episode_id=None)
    assert len(created) == 2  # tried twice, not forever
    assert pool.stats().leased == 0 and pool.stats().creating == 0
