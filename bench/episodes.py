"""Episode benchmark: prints ONE JSON object (not a test).

    .venv/bin/python bench/episodes.py [--episodes 24] [--concurrency 2] [--turns 6]

Part 1 — the orchestration around the model, with the scripted zero-latency policy server (same wire
format as vLLM) and real Docker sandboxes from a warm pool: episodes/s, and per turn the time the
episode loop spends beyond the sandbox step itself (policy round trips, tokenizing, parsing, the
shell session's framing). Target: ≤ 5 ms per turn.

Part 2 — sync vs async at equal work on a long-tail workload (heavy-tailed policy latency per task,
Pareto α 1.5, as with tool-heavy tasks; within a group each sample's latency is its task's times its
own lognormal(0, `--sigma`) draw, and the faster half of a group submits the right answer, the slower
half a wrong one, as an agent that submits at turn 2 beside one that wanders; read_number episodes,
whose CPU work is small), `--pairs` interleaved (sync, async) pairs in one process. Both modes: the real controller dispatching within
the admission bound, the real episode runner in `--slots` worker threads with Docker sandboxes, the
same budget of U·B groups (`--updates` U, `--batch-size` B) hence the same task set, a stand-in trainer
with the real trainer's rules (claim oldest dispatched complete groups, pacing, and the real
`plan_batch`: token staleness mask, hard cap, baseline, drops; see StandInTrainer) and `--step-s` per update, tagging the policy server with each new
version so that every stored token carries the version that sampled it. Sync's bound is 0 by
definition, async's `--staleness` (η). Reported per pair and as medians: wall-clock to the same
counted trained samples, generation-side idle slot-seconds, trainer-side idle seconds, the token-lag
histogram, the masked-token fraction, stale drops, groups with a reward contrast that were not trained,
the trained ÷ examined mean episode seconds (1 = no length bias within groups), and the fraction of
the critical-path bound (formula in the output). The figure to quote is `speedup.median` (min–max); `checks` says whether the targets hold.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import func, select  # noqa: E402
from sqlalchemy import update as sql_update  # noqa: E402

from bench.pairs import interleave, paired_summary  # noqa: E402
from bench.store import scratch_database  # noqa: E402
from core.db import session_scope  # noqa: E402
from core.models import Episode, EpisodeGroup, Run, Task, Turn  # noqa: E402
from core.store import insert_episode  # noqa: E402
from core.termination import DropReason, GroupStatus  # noqa: E402
from environments.code_repo.task import CodeRepoTask, TestSpec, pack_directory  # noqa: E402
from environments.parsing import hermes_call  # noqa: E402
from environments.sandboxes import DockerSandboxes  # noqa: E402
from environments.service import register_environment  # noqa: E402
from environments.spec import parse_spec  # noqa: E402
from sandboxes import InMemoryEventSink, make_backend  # noqa: E402
from task_workers.episode.runner import run_episode  # noqa: E402
from task_workers.policy.client import PolicyClient  # noqa: E402
from task_workers.policy.scripted import serve_in_process, tokenize  # noqa: E402
from trainer.config import LossConfig  # noqa: E402
from trainer.rollouts import load_groups  # noqa: E402
from trainer.selection import StalenessRule, may_step, plan_batch  # noqa: E402
from trainer.store import (  # noqa: E402
    claim_complete_groups,
    nothing_more_to_come,
    oldest_waiting_version,
)

if TYPE_CHECKING:
    from controller.loop import Controller


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
    script = [hermes_call("bash", command="true")] * (turns - 2) + [
        hermes_call("write_file", path="app.py", content="VALUE = 2\n"), hermes_call("submit")]
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
            sandboxes.pool_for(env_spec).wait_ready(timeout_s=120)
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


# -- part 2: sync vs async on a long tail, at equal work ------------------------------------------

def _pareto_delays(n: int, *, seed: int, alpha: float = 1.5, scale_s: float = 0.8, cap_s: float = 12.0) -> list[float]:
    """Heavy-tailed generation latencies, as with tool-heavy agent tasks: most episodes take about a
    second of policy time, a few take ten times that."""
    import random

    rng = random.Random(seed)
    return [round(min(cap_s, scale_s * rng.paretovariate(alpha)), 3) for _ in range(n)]


def _sample_scripts(delays: list[float], *, group_size: int, sigma: float, seed: int,
                    cap_s: float = 30.0) -> tuple[dict[str, Any], list[float]]:
    """Per task, one script per sample (task_workers.policy.scripted.Samples): the first turn's policy
    latency is the task's times the sample's own lognormal(0, `sigma`) draw (at most `cap_s`); the
    faster half of the group submits the right number, the slower half a wrong one, so every group has
    a reward contrast, and it lies between a fast sample and a slow one: no group is dropped for zero
    variance (the budget of U·B groups stays equal work in both modes), and trained ÷ examined seconds
    can only move when a group with its contrast is dropped (the simulation in
    tests/trainer/test_async_staleness.py measures it with zero-variance drops). A retried first turn
    takes the next script. Also every sample's latency."""
    import random

    rng = random.Random(seed)
    scripts: dict[str, Any] = {}
    every: list[float] = []
    for task, delay in enumerate(delays):
        draws = [round(min(cap_s, delay * rng.lognormvariate(0.0, sigma)), 3) for _ in range(group_size)]
        passing = set(sorted(range(group_size), key=lambda k: (draws[k], k))[:max(1, group_size // 2)])
        scripts[f"tail-{task}"] = {"samples": [
            [{"text": hermes_call("bash", command=f"cat {TAIL_PAYLOAD['path']}  # [sample:{k}]"), "delay_s": draw},
             hermes_call("submit", answer=TAIL_PAYLOAD["number"] if k in passing else "0")]
            for k, draw in enumerate(draws)]}
        every += draws
    return scripts, every


# The long-tail workload's task: a read_number episode (a sandbox step, then an exact-match grade of the
# submitted answer). Its CPU work is small, so that on 2 cores the comparison measures scheduling under
# heavy-tailed generation, as on a cluster where generation runs on accelerators; with code_repo's
# pytest grading in fresh sandboxes, 8 slots saturate 2 cores and both modes are CPU-bound.
TAIL_PAYLOAD = {"path": "number.txt", "number": "4711"}


class StandInTrainer:
    """A stand-in GRPO trainer with the real trainer's rules. `consume="complete"` (default): as the real
    trainer claims groups (`trainer.store.claim_complete_groups`: complete groups, oldest dispatched
    first), paced as it is (`trainer.selection.may_step`: no step that would leave a running group past
    the hard cap), through the real `trainer.selection.plan_batch` on the stored per-token versions
    (staleness mask, hard cap, the group's baseline, every drop with its reason, counted in `drops`).
    `consume="dispatch"`: strictly in dispatch order (group_index), each batch waiting for its slowest
    group. Each update takes `step_s` (a sleep: this measures scheduling, not learning); after it the
    scripted server is tagged with the new version (as a weight sync does), so the workers label the
    tokens they sample with it. Trained samples are counted from the episodes of the consumed groups."""

    def __init__(self, *, run_id: int, batch_size: int, bound: int, step_s: float, updates: int,
                 consume: str, url: str, max_token_staleness: int | None = None) -> None:
        self.run_id, self.batch_size, self.bound, self.step_s, self.updates = run_id, batch_size, bound, step_s, updates
        self.consume, self.url = consume, url
        self.rule = StalenessRule.for_bound(bound, max_token_staleness=max_token_staleness if bound else None)
        self.staleness: list[int] = []
        self.token_lags: Counter[int] = Counter()
        self.masked = 0
        self.drops: Counter[str] = Counter()
        self.contrast_lost = 0
        """Groups whose trainable samples' rewards differ, dropped all the same."""
        self.examined: list[int] = []
        """Episode ids of the trainable samples of every group examined (trained or dropped)."""
        self.trained: list[int] = []
        """Episode ids of the samples in every trained group's baseline."""
        self.waits = 0
        self.task_order: list[int] = []
        self.busy_s = 0.0
        self.first_trained_at: float | None = None
        self.finished_at = 0.0
        self.done = threading.Event()

    def _next_batch(self, session: Any, cursor: int) -> list[EpisodeGroup] | None:
        if self.consume == "complete":
            claimed = claim_complete_groups(session, run_id=self.run_id, limit=self.batch_size)
            if len(claimed) == self.batch_size:
                return claimed
            # As the real trainer: fewer only when no more can come (a group was dropped, the budget is
            # spent); none at all then: the run is over.
            last = nothing_more_to_come(session, run_id=self.run_id, claimed={g.id for g in claimed})
            return claimed if last else None
        groups = session.execute(
            select(EpisodeGroup).where(EpisodeGroup.run_id == self.run_id, EpisodeGroup.group_index >= cursor,
                                       EpisodeGroup.status != GroupStatus.DROPPED)
            .order_by(EpisodeGroup.group_index).limit(self.batch_size)
        ).scalars().all()
        if len(groups) < self.batch_size or any(g.status != GroupStatus.COMPLETE for g in groups):
            return None  # the next group in dispatch order is not complete yet: wait for it
        return list(groups)

    def run(self) -> None:
        version, cursor, waiting = 0, 0, False
        with httpx.Client(base_url=self.url.removesuffix("/v1"), timeout=30) as server:
            server.post("/update_weight_version", json={"new_version": "0"})  # every run starts at version 0
            while version < self.updates:
                with session_scope() as session:
                    groups = self._next_batch(session, cursor)
                    if groups == []:
                        break  # nothing more can come (a group was dropped and the budget is spent)
                    paced = groups is not None and may_step(version=version, rule=self.rule, oldest_waiting=(
                        oldest_waiting_version(session, run_id=self.run_id, batch={g.id for g in groups})))
                    if groups is None or not paced:
                        self.waits += groups is not None and not waiting  # a new wait for a lagging group
                        waiting = groups is not None
                        session.rollback()
                        time.sleep(0.01)
                        continue
                    waiting = False
                    loaded = load_groups(session, groups)
                    trainable = {g.id: [s for s in g.samples if s.trainable] for g in loaded}
                    plan = plan_batch(loaded, current_version=version, rule=self.rule, batch_size=len(loaded),
                                      loss=LossConfig())
                    for group in groups:  # as the real trainer: a dropped group is stored with its reason
                        if (reason := plan.dropped.get(group.id)) is not None:
                            group.status, group.drop_reason, group.dropped_step = GroupStatus.DROPPED, reason, version
                            self.drops[reason] += 1
                            self.contrast_lost += len({s.reward for s in trainable[group.id]}) > 1
                            self.examined += [s.episode_id for s in trainable[group.id]]
                    if plan.dropped:
                        continue  # claim again: the rest of this claim waits for a full batch
                    self.token_lags.update(plan.token_lags)
                    self.masked += plan.masked_tokens
                    self.examined += [s.episode_id for g in loaded for s in trainable[g.id]]
                    self.trained += [s.episode_id for s in plan.samples]
                    cursor = max(cursor, groups[-1].group_index + 1)
                    self.staleness += plan.staleness
                    self.task_order += [g.task_id for g in groups]
                    started = time.monotonic()
                    self.first_trained_at = self.first_trained_at or started
                    time.sleep(self.step_s)  # the optimizer step
                    version += 1
                    server.post("/update_weight_version", json={"new_version": str(version)})  # the sync
                    for group in groups:
                        group.status, group.consumed_step = GroupStatus.CONSUMED, version
                    session.execute(sql_update(Run).where(Run.id == self.run_id).values(policy_version=version))
                self.busy_s += time.monotonic() - started  # the update, its commit and the version bump
        self.finished_at = time.monotonic()
        self.done.set()


class SlotClock:
    """Records when each generation slot (a worker thread) ran an episode, on one monotonic clock."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, float, float]] = []  # (episode id, start, end)
        self._lock = threading.Lock()

    def record(self, episode_id: int, start: float, end: float) -> None:
        with self._lock:
            self.spans.append((episode_id, start, end))

    def busy_within(self, start: float, end: float, *, episodes: set[int] | None = None) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for eid, a, b in self.spans
                   if episodes is None or eid in episodes)


CONSUMPTION = {
    "dispatch": "in dispatch order (group_index): a batch waits for its slowest group in both modes",
    "complete": ("as the real trainer: complete groups oldest dispatched first (trainer.store.claim_complete_groups), "
                 "paced by trainer.selection.may_step, the token staleness mask and hard cap applied"),
}
BOUND = ("critical-path bound L = max(ideal pipeline, slowest trained episode + step_s, updates × step_s); ideal "
         "pipeline = max(G + step_s, T + G/updates), G = slot-seconds of the trained episodes / slots, T = updates × "
         "step_s (the last update cannot overlap generation; the first batch cannot overlap training)")


def _seed_tail_run(*, mode: str, label: str, image: str, tasks: int, group_size: int, batch_size: int,
                   updates: int, staleness: int) -> tuple[int, int]:
    """Register the `tail` environment and its tasks (once) and create this run; return its id and staleness bound."""
    from controller.runs import create_run
    from core.schemas import RunConfig

    with session_scope() as session:
        if session.execute(select(Task).where(Task.environment_name == "tail")).first() is None:
            spec = {"name": "tail", "kind": "read_number", "image": image,
                    "sandbox": {"memory": "256m", "pids": 128, "workspace_size": "32m", "tmp_size": "32m"},
                    "limits": {"max_turns": 5, "episode_timeout_s": 300}}
            register_environment(session, spec=parse_spec(spec))
            session.add_all([Task(environment_name="tail", external_id=f"tail-{i}", instruction=f"[script:tail-{i}]",
                                  payload=TAIL_PAYLOAD) for i in range(tasks)])
        # The same seed: the controller's task picks are deterministic in (seed, group index), so both
        # modes dispatch the same tasks in the same order (checked: `task_order` is compared).
        # The same budget in both modes (U·B groups): every dispatched task is trained, in both.
        run = create_run(session, config=RunConfig(
            name=f"tail-{label}", model="scripted", mode=mode, max_staleness=staleness, group_size=group_size,
            batch_size=batch_size, environments=[{"name": "tail"}], seed=0, max_groups=updates * batch_size))
        return run.id, run.max_staleness


def _drive_tail_run(*, controller: Controller, trainer: StandInTrainer, sandboxes: DockerSandboxes,
                    run_id: int) -> tuple[float, float]:
    """Wait for a warm sandbox, then step the controller until the trainer's last update; return (start, wall)."""
    from environments.service import get_environment, spec_of

    with session_scope() as session:
        sandboxes.pool_for(spec_of(get_environment(session, name="tail"))).wait_ready(timeout_s=180)
    started = time.monotonic()
    threading.Thread(target=trainer.run, daemon=True).start()
    while not trainer.done.is_set():
        controller.step()
        trainer.done.wait(0.02)
    wall = trainer.finished_at - started
    with session_scope() as session:
        session.execute(sql_update(Run).where(Run.id == run_id).values(status="stopped"))
    return started, wall


def _tail_run(*, mode: str, label: str, image: str, tasks: int, url: str, slots: int, consume: str,
              group_size: int, batch_size: int, updates: int, step_s: float, staleness: int,
              max_token_staleness: int | None) -> dict[str, Any]:
    from controller.config import ControllerConfig
    from controller.loop import Controller
    from core.db import get_engine

    run_id, bound = _seed_tail_run(mode=mode, label=label, image=image, tasks=tasks, group_size=group_size,
                                   batch_size=batch_size, updates=updates, staleness=staleness)
    backend = make_backend("docker")
    sandboxes = DockerSandboxes(backend=backend, events=InMemoryEventSink(), worker=f"bench-{label}",
                                min_size=slots, max_size=slots)
    client = PolicyClient(base_url=url, tokenizer=tokenize)
    pool = ThreadPoolExecutor(slots)  # the generation side: `slots` episodes at once, in both modes
    clock = SlotClock()

    def run_with_retries(episode_id: int) -> None:
        """What the Celery task does: an infrastructure fault is recorded and the episode run again."""
        from task_workers.episode.errors import InfrastructureFault
        from task_workers.episode.persist import record_fault

        start = time.monotonic()
        try:
            for attempt in range(4):
                try:
                    run_episode(episode_id, policy=client, sandboxes=sandboxes, worker=f"bench-{label}")
                    return
                except InfrastructureFault as fault:
                    with session_scope() as session:
                        record_fault(session, episode_id=episode_id, reason=fault.reason, message=str(fault),
                                     worker=f"bench-{label}", final=attempt == 3)
        finally:
            clock.record(episode_id, start, time.monotonic())

    class LocalDispatcher:  # the worker: threads running the real episode runner
        def send_task(self, name: str, args: Sequence[Any] | None = None, **_: Any) -> None:
            if not args:
                raise ValueError(f"{name}: expected the episode id as the task's argument, got {args!r}")
            pool.submit(run_with_retries, args[0])

    trainer = StandInTrainer(run_id=run_id, batch_size=batch_size, bound=bound, step_s=step_s, updates=updates,
                             consume=consume, url=url, max_token_staleness=max_token_staleness)
    controller = Controller(engine=get_engine(), dispatcher=LocalDispatcher(), settings=ControllerConfig(),
                            name=f"bench-{label}")
    try:
        started, wall = _drive_tail_run(controller=controller, trainer=trainer, sandboxes=sandboxes, run_id=run_id)
    finally:
        controller.close()
        pool.shutdown(wait=True)
        sandboxes.close()
        client.close()
    return _tail_figures(run_id=run_id, trainer=trainer, clock=clock, started=started, wall=wall, slots=slots,
                         bound=bound, step_s=step_s, updates=updates)


def _tail_figures(*, run_id: int, trainer: StandInTrainer, clock: SlotClock, started: float, wall: float,
                  slots: int, bound: int, step_s: float, updates: int) -> dict[str, Any]:
    ended = started + wall
    with session_scope() as session:
        consumed = session.execute(select(Episode.id, Episode.status).join(EpisodeGroup, Episode.group_id ==
                                                                           EpisodeGroup.id)
                                   .where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == GroupStatus.CONSUMED)
                                   ).all()
        generated = session.execute(select(func.count()).select_from(Episode).where(
            Episode.run_id == run_id, Episode.status == "completed")).scalar_one()
        faults = session.execute(select(Episode.failures).where(Episode.run_id == run_id)).scalars().all()
    trained_ids = {eid for eid, status in consumed if status == "completed"}
    trained_work = clock.busy_within(float("-inf"), float("inf"), episodes=trained_ids)
    gen_busy = clock.busy_within(started, ended)
    last_dispatch = max(a for _, a, _ in clock.spans)
    drain_idle = slots * (ended - last_dispatch) - clock.busy_within(last_dispatch, ended)
    generation = trained_work / slots
    ideal = max(generation + step_s, updates * step_s + generation / updates)
    slowest = max((b - a for eid, a, b in clock.spans if eid in trained_ids), default=0.0)
    bound_s = max(ideal, slowest + step_s, updates * step_s)
    sampled = sum(trainer.token_lags.values())
    seconds_of: dict[int, float] = {}  # an episode's seconds in its slots, retries included
    for eid, a, b in clock.spans:
        seconds_of[eid] = seconds_of.get(eid, 0.0) + b - a
    trained_s = [seconds_of[eid] for eid in trainer.trained if eid in seconds_of]
    examined_s = [seconds_of[eid] for eid in trainer.examined if eid in seconds_of]
    return {
        "wall_s": round(wall, 3), "updates": updates, "samples_trained": len(trained_ids),
        "episodes_completed_total": generated,
        "generation_idle_s": round(slots * wall - gen_busy, 3),
        "generation_idle_frac": round(1 - gen_busy / (slots * wall), 3),
        # after the last dispatch (the drain) and before it (admission full while slots are free)
        "generation_idle_drain_s": round(drain_idle, 3),
        "generation_idle_before_last_dispatch_s": round(slots * wall - gen_busy - drain_idle, 3),
        "trainer_idle_s": round(wall - trainer.busy_s, 3), "trainer_busy_s": round(trainer.busy_s, 3),
        "ideal_s": round(ideal, 3), "bound_s": round(bound_s, 3), "fraction_of_bound": round(bound_s / wall, 3),
        "staleness_bound": bound, "max_staleness": max(trainer.staleness, default=0),
        "token_lag_hist": {str(lag): n for lag, n in sorted(trainer.token_lags.items())},
        "masked_token_frac": round(trainer.masked / sampled, 4) if sampled else 0.0,
        "trainer_waits_for_lagging_group": trainer.waits,  # full batches held back by trainer.selection.may_step
        "dropped_stale_groups": trainer.drops[DropReason.STALE_CAP], "drops": dict(trainer.drops),
        "contrast_groups_lost": trainer.contrast_lost,
        "trained_over_examined_seconds": round(statistics.fmean(trained_s) / statistics.fmean(examined_s), 4)
        if trained_s and examined_s else None,
        "task_order": trainer.task_order,
        "faults": sum(len(f or []) for f in faults),
    }


def sync_vs_async(*, image: str, pairs: int, slots: int, updates: int, staleness: int,
                  step_s: float, group_size: int, batch_size: int, consume: str,
                  max_token_staleness: int | None = None, sigma: float = 1.0) -> dict[str, Any]:
    # One task per group: the budget is U·B groups in both modes, the least-used pick covers each once.
    tasks = updates * batch_size
    delays = _pareto_delays(tasks, seed=7)
    scripts, sample_delays = _sample_scripts(delays, group_size=group_size, sigma=sigma, seed=11)
    settings = {"slots": slots, "group_size": group_size, "batch_size": batch_size, "updates": updates,
                "step_s": step_s, "consume": consume, "max_token_staleness": max_token_staleness, "sigma": sigma}
    counter = iter(range(10**6))

    def side(mode: str) -> Callable[[], dict[str, Any]]:
        return lambda: _tail_run(mode=mode, label=f"{mode}-{next(counter)}", image=image, tasks=tasks, url=url,
                                 staleness=staleness, slots=slots, group_size=group_size, batch_size=batch_size,
                                 updates=updates, step_s=step_s, consume=consume,
                                 max_token_staleness=max_token_staleness)

    with serve_in_process(scripts, generate=True) as url:  # per-token version spans, as vLLM's
        runs = interleave(pairs=pairs, sides={"sync": side("sync"), "async": side("async")})
    summary = _paired_speedup(runs)
    same = _same_work(runs)
    _record_policy_delays(runs, delays)
    for run in runs["sync"] + runs["async"]:
        run["task_order"] = run["task_order"][:8] + (["…"] if len(run["task_order"]) > 8 else [])
    return {
        "window": ("wall-clock from the first dispatch to the end of the last update, on both sides; the same "
                   "controller, worker slots, tasks (same dispatch order), number of updates and drop rule"),
        "consumption": (CONSUMPTION[consume]),
        "staleness_bound": {"sync": 0, "async": staleness,
                            "note": "sync mode is the bound 0 by definition; both enforce it with the same rule"},
        **same,
        "bias": _tail_bias(runs),
        "speedup": {"metric": "sync wall ÷ async wall to the same trained samples, per pair",
                    "median": summary["ratio_median"], "min": summary["ratio_min"], "max": summary["ratio_max"],
                    "per_pair": summary["ratios"], "pairs": summary["pairs"]},
        "p50": {mode: {key: _p50(runs, mode, key) for key in ("wall_s", "generation_idle_s", "trainer_idle_s",
                                                              "bound_s", "fraction_of_bound", "masked_token_frac")}
                for mode in ("sync", "async")},
        "async_token_lag_hist": _summed_hist(runs["async"]),
        "bound": BOUND,
        "checks": _tail_checks(runs, summary=summary, same=same),
        "runs": runs,
        "workload": {"policy_delay_s": {"task": _ms_like(delays), "sample": _ms_like(sample_delays)}, "tasks": tasks,
                     **settings,
                     "trainer": "stand-in: step_s per update (sleep), real controller dispatch, "
                                "real episode runner and Docker sandboxes, the real trainer's claim, pacing and "
                                "staleness mask"},
        "targets": {"speedup": 3.0, "fraction_of_bound": 0.8, "masked_token_frac": 0.02},
    }


def _paired_speedup(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each pair's async speed over its sync speed (speed = 1 / wall), summarised by bench.pairs."""
    for run in runs["sync"] + runs["async"]:
        run["speed"] = 1.0 / run["wall_s"]
    summary = paired_summary(runs["async"], runs["sync"], key="speed")
    for run in runs["sync"] + runs["async"]:
        run.pop("speed")
    return summary


def _same_work(runs: dict[str, list[dict[str, Any]]]) -> dict[str, bool]:
    """Whether each pair's two modes dispatched the same tasks (in order, in any order) and trained as many samples."""
    paired = list(zip(runs["async"], runs["sync"], strict=True))
    return {"same_tasks_in_same_order": all(a["task_order"] == s["task_order"] for a, s in paired),
            "same_tasks_in_any_order": all(sorted(a["task_order"]) == sorted(s["task_order"]) for a, s in paired),
            "same_samples_trained": all(a["samples_trained"] == s["samples_trained"] for a, s in paired)}


def _record_policy_delays(runs: dict[str, list[dict[str, Any]]], delays: list[float]) -> None:
    """Add to each run the mean scripted policy delay of the tasks it trained on."""
    with session_scope() as session:  # task id → its scripted policy delay: what each run trained on
        delay_of = {task_id: delays[int(external.removeprefix("tail-"))] for task_id, external in session.execute(
            select(Task.id, Task.external_id).where(Task.environment_name == "tail")).all()}
    for run in runs["sync"] + runs["async"]:
        run["trained_policy_delay_mean_s"] = round(statistics.fmean(delay_of[t] for t in run["task_order"]), 3)


def _p50(runs: dict[str, list[dict[str, Any]]], mode: str, key: str) -> float:
    """The median of one figure over a mode's runs, to 3 places."""
    return round(statistics.median(r[key] for r in runs[mode]), 3)


def _tail_bias(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Whether either mode leaned to fast tasks or fast samples: delays, drops and lost contrast per mode."""
    return {"trained_policy_delay_mean_s": {mode: _p50(runs, mode, "trained_policy_delay_mean_s")
                                            for mode in ("sync", "async")},
            "dropped_stale_groups": {mode: _p50(runs, mode, "dropped_stale_groups") for mode in ("sync", "async")},
            "trained_over_examined_seconds": {mode: _p50(runs, mode, "trained_over_examined_seconds")
                                              for mode in ("sync", "async")},
            "contrast_groups_lost": {mode: sum(r["contrast_groups_lost"] for r in runs[mode])
                                     for mode in ("sync", "async")},
            "note": "p50 over runs of the mean scripted policy delay of the groups each trained on (equal "
                    "in both modes when the same tasks are trained; lower in async = biased to fast tasks); "
                    "p50 over runs of the trained samples' mean episode seconds ÷ the examined samples' "
                    "(1 = no bias within groups); groups with a reward contrast not trained, all runs"}


def _tail_checks(runs: dict[str, list[dict[str, Any]]], *, summary: dict[str, Any],
                 same: dict[str, bool]) -> dict[str, bool]:
    """The benchmark's targets, each true or false."""
    every = runs["sync"] + runs["async"]
    return {
        "zero_stale_drops": all(r["dropped_stale_groups"] == 0 for r in every),
        "zero_contrast_groups_lost": all(r["contrast_groups_lost"] == 0 for r in every),
        "trained_over_examined_seconds_within_5pct": all(
            r["trained_over_examined_seconds"] is not None and abs(r["trained_over_examined_seconds"] - 1) <= 0.05
            for r in every),
        "same_task_set": same["same_tasks_in_any_order"] and same["same_samples_trained"],
        "speedup_at_least_3": summary["ratio_median"] >= 3.0,
        "async_at_least_80pct_of_bound": _p50(runs, "async", "fraction_of_bound") >= 0.8,
        "masked_at_most_2pct": all(r["masked_token_frac"] <= 0.02 for r in every),
    }


def _summed_hist(runs: list[dict[str, Any]]) -> dict[str, int]:
    """Every run's trained tokens by version lag, summed."""
    total: Counter[str] = Counter()
    for run in runs:
        total.update(run["token_lag_hist"])
    return dict(sorted(total.items(), key=lambda item: int(item[0])))


def _ms_like(delays: list[float]) -> dict[str, float]:
    ordered = sorted(delays)
    return {"p50": ordered[len(ordered) // 2], "max": ordered[-1], "mean": round(statistics.fmean(ordered), 3)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--part", choices=["all", "orchestration", "tail"], default="all")
    parser.add_argument("--pairs", type=int, default=5, help="part 2: interleaved (sync, async) pairs")
    parser.add_argument("--updates", type=int, default=32, help="part 2: trained batches per run (U)")
    # 12, not 16: the admission window holds (η + 1)·B groups = 24 episodes at η 2, one batch of them (8)
    # is in training, so at most 16 run and every complete group waiting for the trainer idles two slots;
    # 16 slots were 23 % idle before the last dispatch by design (bench/episodes.py --part tail --slots 16).
    parser.add_argument("--slots", type=int, default=12, help="part 2: episodes run at once (both modes)")
    parser.add_argument("--staleness", type=int, default=2, help="part 2: async mode's staleness bound")
    parser.add_argument("--step-s", type=float, default=1.0, help="part 2: seconds per (stand-in) update")
    parser.add_argument("--group-size", type=int, default=2, help="part 2: episodes per group")
    parser.add_argument("--batch-size", type=int, default=4, help="part 2: groups per update")
    parser.add_argument("--sigma", type=float, default=1.0,
                        help="part 2: spread of durations within a group: each sample's latency is its task's × "
                             "lognormal(0, σ); 0 gives every sample of a task the same latency")
    parser.add_argument("--max-token-staleness", type=int, default=None,
                        help="part 2: async mode's token bound (default 2 × --staleness): masking and pacing")
    parser.add_argument("--consume", choices=sorted(CONSUMPTION), default="complete",
                        help="part 2: the stand-in trainer's order of consumption")
    args = parser.parse_args(argv)
    for name in ("episodes", "concurrency", "turns", "pairs", "updates", "slots", "group_size", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    if args.staleness < 1 or args.step_s < 0:
        parser.error(f"--staleness ≥ 1 and --step-s ≥ 0 expected, got {args.staleness} and {args.step_s}")
    if not 0 <= args.sigma <= 3:
        parser.error(f"--sigma: expected 0 to 3, got {args.sigma}")
    import logging
    import tempfile

    logging.disable(logging.INFO)
    from environments.images import build_images

    image = next(b.tag for b in build_images() if b.name == "code-repo")
    result: dict[str, Any] = {"benchmark": "episodes",
                              "command": "bench/episodes.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    with scratch_database("bench_episodes"), tempfile.TemporaryDirectory() as tmp:
        if args.part in ("all", "orchestration"):
            result["orchestration"] = orchestration(image=image, tmp=Path(tmp), episodes=args.episodes,
                                                    concurrency=args.concurrency, turns=args.turns)
        if args.part in ("all", "tail"):
            result["sync_vs_async"] = sync_vs_async(
                image=image, pairs=args.pairs, slots=args.slots, updates=args.updates,
                staleness=args.staleness, step_s=args.step_s, group_size=args.group_size, batch_size=args.batch_size,
                consume=args.consume, max_token_staleness=args.max_token_staleness, sigma=args.sigma)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
