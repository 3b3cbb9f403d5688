"""Episode benchmark: prints ONE JSON object (not a test).

    .venv/bin/python bench/episodes.py [--episodes 24] [--concurrency 2] [--turns 6]

Part 1 — the orchestration around the model, with the scripted zero-latency policy server (same wire
format as vLLM) and real Docker sandboxes from a warm pool: episodes/s, and per turn the time the
episode loop spends beyond the sandbox step itself (policy round trips, tokenizing, parsing, the
shell session's framing). Target: ≤ 5 ms per turn.

Part 2 — sync vs async on a long-tail workload (heavy-tailed policy latency, as with tool-heavy
tasks): wall-clock until the same number of groups has been trained on, with the real controller
deciding what to dispatch and a stand-in trainer that consumes complete batches (fixed step time)
and bumps the policy version. Target: async ≥ 2× faster, staleness never above the bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import select  # noqa: E402

from bench.store import scratch_database  # noqa: E402
from core.db import session_scope  # noqa: E402
from core.models import Episode, EpisodeGroup, Run, Task, Turn  # noqa: E402
from core.store import insert_episode  # noqa: E402
from environments.code_repo.task import CodeRepoTask, TestSpec, pack_directory  # noqa: E402
from environments.service import register_environment  # noqa: E402
from environments.spec import parse_spec  # noqa: E402
from task_workers.context import DockerSandboxes  # noqa: E402
from task_workers.episode.runner import run_episode  # noqa: E402
from task_workers.policy.client import PolicyClient  # noqa: E402
from task_workers.sandbox import InMemoryEventSink, make_backend  # noqa: E402
from tests.support.scripted_policy import serve_in_process, tokenize, tool_call  # noqa: E402


def _task_payload(tmp: Path) -> dict[str, Any]:
    repo = tmp / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "app.py").write_text("VALUE = 1\n")
    test = "import app\n\n\ndef test_value():\n    assert app.VALUE == 2\n"
    task = CodeRepoTask(repo=pack_directory(repo),
                        hidden_tests=TestSpec(paths=["test_app.py"], files={"test_app.py": test}))
    return task.model_dump(mode="json")


def _seed(*, image: str, payload: dict[str, Any], episodes: int, script: str) -> list[int]:
    spec = {"name": "bench", "kind": "code_repo", "image": image,
            "sandbox": {"memory": "512m", "pids": 256, "workspace_size": "64m", "tmp_size": "64m"},
            "limits": {"max_turns": 50, "episode_timeout_s": 300}}
    ids = []
    with session_scope() as session:
        env, _ = register_environment(session, spec=parse_spec(spec))
        task = Task(environment_name="bench", external_id=script, instruction=f"[script:{script}]", payload=payload)
        # Not a controller-managed run (status completed): the episodes are run directly.
        run = Run(name=f"bench-{script}", model="scripted", group_size=1, batch_size=1, config={},
                  status="completed")
        session.add_all([task, run])
        session.flush()
        for index in range(episodes):
            group = EpisodeGroup(run_id=run.id, group_index=index, task_id=task.id, environment_id=env.id, size=1,
                                 policy_version=0)
            session.add(group)
            session.flush()
            ids.append(insert_episode(session, run_id=run.id, group_id=group.id, sample_index=0, task_id=task.id,
                                      environment_id=env.id)[0])
    return ids


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(v * 1000 for v in values)
    return {"p50": round(statistics.median(ordered), 3), "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
            "mean": round(statistics.fmean(ordered), 3)}


def orchestration(*, image: str, tmp: Path, episodes: int, concurrency: int, turns: int) -> dict[str, Any]:
    script = [tool_call("bash", command="true")] * (turns - 2) + [
        tool_call("write_file", path="app.py", content="VALUE = 2\n"), tool_call("submit")]
    ids = _seed(image=image, payload=_task_payload(tmp), episodes=episodes, script="orchestration")
    backend = make_backend("docker")
    sandboxes = DockerSandboxes(backend=backend, events=InMemoryEventSink(), worker="bench", min_size=concurrency,
                                max_size=concurrency + 1)
    # The policy server runs in its own process, as vLLM does: it must not share our GIL.
    with serve_in_process({"orchestration": script}) as url:
        # Environment text is tokenized locally, as a worker does when it has the model's tokenizer.
        client = PolicyClient(base_url=url, tokenizer=tokenize)
        try:
            from environments.service import get_environment, spec_of

            with session_scope() as session:
                env_spec = spec_of(get_environment(session, name="bench"))
            sandboxes.pool_for(env_spec).wait_ready(timeout=120)
            started = time.monotonic()
            with ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(lambda i: run_episode(i, policy=client, sandboxes=sandboxes, worker="bench"), ids))
            wall = time.monotonic() - started
        finally:
            client.close()
            sandboxes.close()
    return _orchestration_figures(ids, wall)


def _orchestration_figures(ids: list[int], wall: float) -> dict[str, Any]:
    per_turn_overhead, step_times = [], []
    with session_scope() as session:
        for episode in session.execute(select(Episode).where(Episode.id.in_(ids))).scalars():
            durations = session.execute(select(Turn.duration_s).where(Turn.episode_id == episode.id)).scalars().all()
            t = episode.timings
            loop_s = t["total"] - t["lease"] - t["setup"] - t["verify"]
            per_turn_overhead.append((loop_s - sum(d or 0 for d in durations)) / max(1, len(durations)))
            step_times += [d for d in durations if d is not None]
        statuses = session.execute(select(Episode.termination_reason).where(Episode.id.in_(ids))).scalars().all()
    return {
        "episodes": len(ids), "wall_s": round(wall, 3), "episodes_per_s": round(len(ids) / wall, 3),
        "overhead_per_turn_ms": _ms(per_turn_overhead), "sandbox_step_ms": _ms(step_times),
        "all_submitted": all(s == "submitted" for s in statuses), "target_overhead_ms": 5.0,
    }


# -- part 2: sync vs async on a long tail ---------------------------------------------------------

def _pareto_delays(n: int, *, seed: int, alpha: float = 1.5, scale_s: float = 0.8, cap_s: float = 12.0) -> list[float]:
    """Heavy-tailed generation latencies, as with tool-heavy agent tasks: most episodes take about a
    second of policy time, a few take ten times that."""
    import random

    rng = random.Random(seed)
    return [round(min(cap_s, scale_s * rng.paretovariate(alpha)), 3) for _ in range(n)]


class StandInTrainer:
    """Consumes complete groups a batch at a time, takes `step_s` per update, bumps the policy version.
    It stands in for the GRPO trainer here because this measures scheduling, not learning."""

    def __init__(self, *, run_id: int, batch_size: int, bound: int, step_s: float, updates: int) -> None:
        self.run_id, self.batch_size, self.bound, self.step_s, self.updates = run_id, batch_size, bound, step_s, updates
        self.staleness: list[int] = []
        self.dropped = 0
        self.done = __import__("threading").Event()

    def run(self) -> None:
        from sqlalchemy import update

        version = 0
        while version < self.updates:
            with session_scope() as session:
                groups = session.execute(
                    select(EpisodeGroup).where(EpisodeGroup.run_id == self.run_id, EpisodeGroup.status == "complete")
                    .order_by(EpisodeGroup.id).limit(self.batch_size).with_for_update(skip_locked=True)
                ).scalars().all()
                if len(groups) < self.batch_size:
                    session.rollback()
                    time.sleep(0.02)
                    continue
                stale = [g for g in groups if version - g.policy_version > self.bound]
                for group in stale:  # as the real trainer does: never learn from samples past the bound
                    group.status = "dropped"
                if stale:
                    self.dropped += len(stale)
                    continue
                self.staleness += [version - g.policy_version for g in groups]
                time.sleep(self.step_s)  # the optimizer step
                version += 1
                for group in groups:
                    group.status, group.consumed_step = "consumed", version
                session.execute(update(Run).where(Run.id == self.run_id).values(policy_version=version))
        self.done.set()


def _tail_run(*, mode: str, image: str, payload: dict[str, Any], delays: list[float], url: str,
              concurrency: int, group_size: int, batch_size: int, updates: int, step_s: float) -> dict[str, Any]:
    import threading

    from controller.config import ControllerConfig
    from controller.loop import Controller
    from controller.runs import create_run
    from core.db import get_engine
    from core.schemas import RunConfig

    with session_scope() as session:
        if session.execute(select(Task).where(Task.environment_name == "tail")).first() is None:
            spec = {"name": "tail", "kind": "code_repo", "image": image,
                    "sandbox": {"memory": "256m", "pids": 128, "workspace_size": "32m", "tmp_size": "32m"},
                    "limits": {"max_turns": 5, "episode_timeout_s": 300}}
            register_environment(session, spec=parse_spec(spec))
            session.add_all([Task(environment_name="tail", external_id=f"tail-{i}", instruction=f"[script:tail-{i}]",
                                  payload=payload) for i in range(len(delays))])
        run = create_run(session, config=RunConfig(
            name=f"tail-{mode}", model="scripted", mode=mode, max_staleness=1, group_size=group_size,
            batch_size=batch_size, environments=[{"name": "tail"}]))
        run_id, bound = run.id, run.max_staleness
    backend = make_backend("docker")
    sandboxes = DockerSandboxes(backend=backend, events=InMemoryEventSink(), worker=f"bench-{mode}",
                                min_size=concurrency, max_size=concurrency)
    client = PolicyClient(base_url=url, tokenizer=tokenize)
    pool = ThreadPoolExecutor(concurrency)

    def run_with_retries(episode_id: int) -> None:
        """What the Celery task does: an infrastructure fault is recorded and the episode run again."""
        from task_workers.episode.errors import InfrastructureFault
        from task_workers.episode.persist import record_fault

        for attempt in range(4):
            try:
                run_episode(episode_id, policy=client, sandboxes=sandboxes, worker=f"bench-{mode}")
                return
            except InfrastructureFault as fault:
                with session_scope() as session:
                    record_fault(session, episode_id=episode_id, reason=fault.reason, message=str(fault),
                                 worker=f"bench-{mode}", final=attempt == 3)

    class LocalDispatcher:  # the worker: threads running the real episode runner
        def send_task(self, name: str, args: list[int] | None = None, **_: Any) -> None:
            pool.submit(run_with_retries, args[0])

    trainer = StandInTrainer(run_id=run_id, batch_size=batch_size, bound=bound, step_s=step_s, updates=updates)
    controller = Controller(engine=get_engine(), dispatcher=LocalDispatcher(), settings=ControllerConfig(),
                            name=f"bench-{mode}")
    try:
        with session_scope() as session:
            from environments.service import get_environment, spec_of

            sandboxes.pool_for(spec_of(get_environment(session, name="tail"))).wait_ready(timeout=180)
        started = time.monotonic()
        threading.Thread(target=trainer.run, daemon=True).start()
        while not trainer.done.is_set():
            controller.step()
            trainer.done.wait(0.02)
        wall = time.monotonic() - started
        with session_scope() as session:
            session.execute(__import__("sqlalchemy").update(Run).where(Run.id == run_id).values(status="stopped"))
    finally:
        controller.close()
        pool.shutdown(wait=True)
        sandboxes.close()
        client.close()
    with session_scope() as session:
        rows = session.execute(select(Episode.termination_reason, Episode.timings, Episode.failures)
                               .where(Episode.run_id == run_id, Episode.status == "completed")).all()
    totals = [timings["total"] for _, timings, _ in rows]
    return {"wall_s": round(wall, 3), "updates": updates, "samples_trained": updates * batch_size * group_size,
            "max_staleness": max(trainer.staleness), "staleness_bound": bound,
            "episode_s": {"max": round(max(totals), 3), "mean": round(statistics.fmean(totals), 3)},
            "reasons": sorted({reason for reason, _, _ in rows}), "retried": sum(bool(f) for _, _, f in rows),
            "faults": [fault["message"][-240:] for _, _, failures in rows for fault in failures],
            "dropped_stale_groups": trainer.dropped}


def sync_vs_async(*, image: str, tmp: Path, concurrency: int, updates: int) -> dict[str, Any]:
    # As many tasks as trained groups: both modes train on the same tasks, each once.
    delays = _pareto_delays(updates * 4, seed=7)
    scripts = {f"tail-{i}": [{"text": tool_call("bash", command="true"), "delay_s": d}, tool_call("submit")]
               for i, d in enumerate(delays)}
    payload = _task_payload(tmp)
    settings = {"concurrency": concurrency, "group_size": 2, "batch_size": 4, "updates": updates, "step_s": 2.0}
    assert settings["batch_size"] == 4  # the task count above
    with serve_in_process(scripts) as url:
        results = {mode: _tail_run(mode=mode, image=image, payload=payload, delays=delays, url=url, **settings)
                   for mode in ("sync", "async")}
    return {**results, "workload": {"policy_delay_s": _ms_like(delays), **settings,
                                    "trainer": "stand-in: fixed step_s per update, real controller dispatch"},
            "async_speedup": round(results["sync"]["wall_s"] / results["async"]["wall_s"], 2), "target_speedup": 2.0}


def _ms_like(delays: list[float]) -> dict[str, float]:
    ordered = sorted(delays)
    return {"p50": ordered[len(ordered) // 2], "max": ordered[-1], "mean": round(statistics.fmean(ordered), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--part", choices=["all", "orchestration", "tail"], default="all")
    parser.add_argument("--updates", type=int, default=5, help="part 2: trained batches to wait for")
    parser.add_argument("--tail-concurrency", type=int, default=8, help="part 2: episodes run at once")
    args = parser.parse_args()
    import logging
    import tempfile

    logging.disable(logging.INFO)
    from environments.images import build_images

    image = next(b.tag for b in build_images() if b.name == "code-repo")
    result: dict[str, Any] = {"benchmark": "episodes"}
    with scratch_database("bench_episodes"), tempfile.TemporaryDirectory() as tmp:
        if args.part in ("all", "orchestration"):
            result["orchestration"] = orchestration(image=image, tmp=Path(tmp), episodes=args.episodes,
                                                    concurrency=args.concurrency, turns=args.turns)
        if args.part in ("all", "tail"):
            result["sync_vs_async"] = sync_vs_async(image=image, tmp=Path(tmp), concurrency=args.tail_concurrency,
                                                    updates=args.updates)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
