"""Sandbox benchmark: prints ONE JSON object (not a test). Run: `.venv/bin/python bench/sandbox.py` (or `make bench`).

Side by side, on this machine's dockerd:
  * step latency p50/p99 for `true` and for 1 MB of output: persistent shell session vs one
    `docker exec` per command (same command, same container);
  * warm acquire from a pool vs a cold create;
  * git reset (repo sandbox, dirtied before every reset) p50;
  * sustained create+destroy rate (2 threads);
  * containers of this process left behind after everything is closed (must be 0).
Targets (2 cores): step p50 <= 2 ms and >= 20x faster than docker exec; warm acquire p50 <= 10 ms;
reset p50 <= 150 ms; 0 leaks.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments.images import build_images
from sandboxes import SandboxBackend, SandboxPool, SandboxSpec, create_sandbox, make_backend
from sandboxes.docker_client import docker_api
from sandboxes.labels import OWNER, Owner

ONE_MB = "head -c 1048576 /dev/zero | tr '\\0' a"


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {"p50": round(statistics.median(ms), 3), "p99": round(p99, 3), "n": len(ms)}


def timed(fn: Callable[[], object], n: int, *, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def docker_exec(container_id: str, command: str, user: str) -> int:
    """The usual alternative: one `docker exec bash -c CMD` per command, output read, exit code fetched."""
    api = docker_api()
    exec_id = api.exec_create(container_id, ["bash", "-c", command], user=user)["Id"]
    api.exec_start(exec_id)
    return int(api.exec_inspect(exec_id)["ExitCode"])


def bench_steps(backend: SandboxBackend, spec: SandboxSpec) -> dict[str, Any]:
    sandbox = create_sandbox(backend=backend, spec=spec)
    try:
        results: dict[str, Any] = {}
        for name, command, n_shell, n_exec in (("true", "true", 500, 40), ("1mb_output", ONE_MB, 40, 20)):
            shell = summary(timed(lambda: sandbox.step(command), n_shell))  # noqa: B023 (called at once)
            exec_ = summary(timed(lambda: docker_exec(sandbox.container_id, command, spec.user), n_exec))  # noqa: B023
            speedup = round(exec_["p50"] / shell["p50"], 1)
            results[name] = {"shell_session_ms": shell, "docker_exec_ms": exec_, "speedup_p50": speedup}
        assert len(sandbox.step(ONE_MB).stdout) == 1 << 20  # the session really moved the whole megabyte
        return results
    finally:
        sandbox.destroy()


def bench_acquire(backend: SandboxBackend, spec: SandboxSpec) -> dict[str, Any]:
    with SandboxPool(spec=spec, backend=backend, min_size=2, max_size=4) as pool:
        pool.wait_ready(timeout_s=120)
        warm = []
        for _ in range(40):
            pool.wait_ready(timeout_s=120)
            start = time.perf_counter()
            sandbox = pool.acquire()
            warm.append(time.perf_counter() - start)
            pool.release(sandbox)
        stats = pool.stats()
    cold = []
    for _ in range(10):
        start = time.perf_counter()
        sandbox = create_sandbox(backend=backend, spec=spec)
        cold.append(time.perf_counter() - start)
        sandbox.destroy()
    return {"warm_ms": summary(warm), "cold_create_ms": summary(cold), "warm_hits": stats.warm_acquires}


def bench_reset(backend: SandboxBackend, spec: SandboxSpec) -> dict[str, Any]:
    sandbox = create_sandbox(backend=backend, spec=spec)
    dirty = "echo x >> calc.py && echo y > new.txt && mkdir -p __pycache__ && touch __pycache__/c.pyc"
    samples = []
    try:
        for n in range(30):
            sandbox.step(f"{dirty} && git commit -qam 'agent {n}' && echo z > /tmp/scratch")
            start = time.perf_counter()
            sandbox.reset()
            samples.append(time.perf_counter() - start)
        clean = sandbox.step("git status --porcelain --ignored").stdout == ""
    finally:
        sandbox.destroy()
    return {"git_reset_ms": summary(samples), "verified_clean": clean}


def bench_churn(backend: SandboxBackend, spec: SandboxSpec, *, total: int = 16, threads: int = 2) -> dict[str, Any]:
    def one(_: int) -> None:
        create_sandbox(backend=backend, spec=spec).destroy()

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, range(total)))
    elapsed = time.perf_counter() - start
    return {"per_second": round(total / elapsed, 2), "containers": total, "threads": threads}


def main() -> None:
    images = {b.name: b.tag for b in build_images()}
    backend = make_backend("docker")
    base = SandboxSpec(image=images["base"], memory="512m", output_head="1m", output_tail="1m")
    repo = SandboxSpec(image=images["code-repo"], memory="512m", workspace_seed="/opt/seed")
    steps = bench_steps(backend, base)
    acquire = bench_acquire(backend, base)
    reset = bench_reset(backend, repo)
    churn = bench_churn(backend, base)
    leaked = len(backend.list(labels={OWNER: str(Owner.current())}))
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "docker": docker_api().version().get("Version")},
        "step": steps,
        "acquire": acquire,
        "reset": reset,
        "create_destroy": churn,
        "leaked_containers": leaked,
    }
    report["targets_met"] = {
        "step_true_p50_le_2ms": steps["true"]["shell_session_ms"]["p50"] <= 2.0,
        "step_true_speedup_ge_20x": steps["true"]["speedup_p50"] >= 20,
        "warm_acquire_p50_le_10ms": acquire["warm_ms"]["p50"] <= 10.0,
        "reset_p50_le_150ms": reset["git_reset_ms"]["p50"] <= 150.0,
        "no_leaks": leaked == 0,
    }
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
