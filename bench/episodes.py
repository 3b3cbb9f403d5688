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
    task = CodeRepoTask(repo=pack_directory(repo),
                        hidden_tests=TestSpec(command="python3 -c 'import app; assert app.VALUE == 2'"))
    return task.model_dump(mode="json")


def _seed(*, image: str, payload: dict[str, Any], episodes: int, script: str) -> list[int]:
    spec = {"name": "bench", "kind": "code_repo", "image": image,
            "sandbox": {"memory": "512m", "pids": 256, "workspace_size": "64m", "tmp_size": "64m"},
            "limits": {"max_turns": 50, "episode_timeout_s": 300}}
    ids = []
    with session_scope() as session:
        env, _ = register_environment(session, spec=parse_spec(spec))
        task = Task(environment_name="bench", external_id=script, instruction=f"[script:{script}]", payload=payload)
        run = Run(name=f"bench-{script}", model="scripted", group_size=1, batch_size=1, config={})
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    import logging
    import tempfile

    logging.disable(logging.INFO)
    from environments.images import build_images

    image = next(b.tag for b in build_images() if b.name == "code-repo")
    result: dict[str, Any] = {"benchmark": "episodes"}
    with scratch_database("bench_episodes"), tempfile.TemporaryDirectory() as tmp:
        result["orchestration"] = orchestration(image=image, tmp=Path(tmp), episodes=args.episodes,
                                                concurrency=args.concurrency, turns=args.turns)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
