"""One episode, end to end:

    claim → open (prepare, lease a sandbox, set the task up: driver.py) → agent loop → verdict → store
    episode + turns in ONE transaction → the sandbox is reset and returned to its pool (or destroyed).

Infrastructure faults (sandbox, policy) propagate as InfrastructureFault for the Celery task to
retry; the agent's own outcomes are stored. Running the same episode twice stores one copy. Under a
pairwise judge, the worker that stores a group's last episode then judges the group (group_judge.py); a
redelivered episode that has already ended judges its group if that is still to do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select

from core.canaries import canary_score, is_canary
from core.db import session_scope
from core.flags import EpisodeFlag
from core.models import Environment, Episode, Task
from core.schemas.run import Sampling, stored_run
from core.seeds import episode_seed
from core.termination import RunPurpose, TerminationReason
from environments.base import (
    EnvironmentKind,
    ToolCall,
    Verdict,
)
from environments.judge import flag_injection, transcript_of
from environments.registry import get_kind
from environments.rewards import total
from environments.service import spec_of
from environments.spec import EnvironmentSpec
from task_workers.episode.driver import EpisodeDriver, Opened, SandboxProvider
from task_workers.episode.errors import JudgeFault, UnreachablePool
from task_workers.episode.group_judge import group_of, judge_finished_group
from task_workers.episode.learned import has_learned_layers, rescore_stored, with_learned
from task_workers.episode.loop import LoopContext, initial_prompt, run_agent_loop
from task_workers.episode.persist import Unscored, claim_episode, store_episode
from task_workers.episode.program import run_program
from task_workers.episode.trajectory import ArtifactRecord, Trajectory
from task_workers.policy.client import PolicyClient
from task_workers.policy.pool import EpisodePolicy, PolicyPool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeOutcome:
    episode_id: int
    stored: bool
    termination: TerminationReason | None
    reward: float | None
    """None: not stored, or stored `scoring` (its judge did not answer yet: task_workers/episode/learned.py)."""


@dataclass(frozen=True)
class _Loaded:
    episode_id: int
    run_id: int
    group_id: int
    spec: EnvironmentSpec
    instruction: str
    payload: dict[str, Any]
    sampling: Sampling
    training: bool
    """The run is trained on: every turn needs a known weight version."""
    expect_version: int | None
    """An eval run of a checkpoint: the label its weights were loaded under; a turn sampled under another is
    refused."""
    seed: int
    """The episode's sampling seed (core.seeds.episode_seed of the run's seed and its group and sample)."""
    policy_urls: list[str] | None = None
    """The run's own policy servers (its config's policy_urls); None: the worker's pool."""
    canary: bool = False
    """The task is a hack canary (core/canaries.py): any reward on its verification layer is a hack."""


def _load(episode_id: int, *, worker: str, incarnation: str | None) -> _Loaded | None:
    with session_scope() as session:
        episode = claim_episode(session, episode_id=episode_id, worker=worker, incarnation=incarnation)
        if episode is None:
            return None
        env_row = session.get(Environment, episode.environment_id)
        task = session.get(Task, episode.task_id)
        assert env_row is not None and task is not None  # foreign keys
        spec = spec_of(env_row)
        sampling, training, expect_version, seed, policy_urls = _run_sampling(session, episode)
        # No deadline yet: the agent's time budget starts at its first observation (run_agent_loop).
        return _Loaded(
            episode_id=episode.id, run_id=episode.run_id, group_id=episode.group_id, spec=spec, instruction=task.instruction,
            payload=task.payload, sampling=sampling, training=training, expect_version=expect_version, seed=seed,
            policy_urls=policy_urls, canary=is_canary(task.split),
        )


def _run_sampling(session: Any, episode: Episode) -> tuple[Sampling, bool, int | None, int, list[str] | None]:
    """The run's sampling settings (validated at launch; parsed again here, never read raw), whether
    the run is trained on, the label of the checkpoint weights it evaluates (None: no checkpoint), the
    episode's sampling seed and the run's own policy servers (None: it names none)."""
    from core.models import EpisodeGroup, Run

    config, purpose = session.execute(select(Run.config, Run.purpose).where(Run.id == episode.run_id)).one()
    group_index = session.execute(select(EpisodeGroup.group_index)
                                  .where(EpisodeGroup.id == episode.group_id)).scalar_one()
    stored = stored_run(config, run_id=episode.run_id)
    seed = episode_seed(run_seed=stored.seed, group_index=group_index, sample_index=episode.sample_index)
    return (stored.sampling, purpose == RunPurpose.TRAIN,
            None if stored.checkpoint is None else stored.checkpoint.tag, seed, stored.policy_urls)


def run_episode(
    episode_id: int, *, policy: PolicyClient | PolicyPool, sandboxes: SandboxProvider, worker: str,
    incarnation: str | None = None, pools: Callable[[list[str]], PolicyPool] | None = None,
) -> EpisodeOutcome:
    """`policy`: one server, or a pool whose replica the episode leases for all its turns. `pools`: the
    pool of a run that names its own servers (core.schemas.run.RunConfig.policy_urls); without it such a
    run's episode is an infrastructure fault. `incarnation`: the worker process's (task_workers.heartbeat),
    recorded on the episode so that the controller requeues it at once if that process dies; None
    outside a worker (no heartbeat to judge it by)."""
    started = time.monotonic()
    loaded = _load(episode_id, worker=worker, incarnation=incarnation)
    if loaded is None:
        return _already_ended(episode_id, worker=worker)
    kind = get_kind(loaded.spec.kind)(loaded.spec)
    driver = EpisodeDriver(kind, spec=loaded.spec, sandboxes=sandboxes, run_id=loaded.run_id, episode_id=episode_id)
    with ExitStack() as stack:
        served = _policy_of(loaded, policy, pools)
        episode_policy = stack.enter_context(served.episode()) if isinstance(served, PolicyPool) else served
        opened = stack.enter_context(driver.open(loaded.payload, instruction=loaded.instruction))
        loaded = replace(loaded, spec=driver.spec)  # on the task's own image, if it names one
        trajectory = _play(loaded, kind, opened, episode_policy)
        verifying = time.monotonic()
        verdict = driver.verdict(submitted=trajectory.submitted, actions=[
            ToolCall(turn.tool_call["name"], turn.tool_call.get("arguments", {}))
            for turn in trajectory.turns if turn.tool_call])
        timings = {**trajectory.timings, **opened.timings, "verify": time.monotonic() - verifying}
        sandbox_id = getattr(opened.sandbox, "id", None)
    verdict, unscored = _screened(loaded, trajectory, verdict, worker=worker, timings=timings)
    timings["total"] = time.monotonic() - started
    return _stored(loaded, trajectory, verdict, unscored, sandbox_id=sandbox_id, timings=timings, worker=worker)


def _already_ended(episode_id: int, *, worker: str) -> EpisodeOutcome:
    """A redelivered episode that has been played: judged from the store if it awaits its judge, and its
    group judged if that is still to do (after an outage)."""
    rescored = rescore_stored(episode_id, worker=worker)
    group_id = group_of(episode_id)
    grouped = group_id is not None and judge_finished_group(group_id, worker=worker)
    logger.info("episode %s already played; %s", episode_id, f"judged group {group_id}" if grouped else
                "judged it" if rescored else "nothing to do")
    return EpisodeOutcome(episode_id, False, None, None)


def _policy_of(loaded: _Loaded, policy: PolicyClient | PolicyPool,
               pools: Callable[[list[str]], PolicyPool] | None) -> PolicyClient | PolicyPool:
    """The worker's policy, or the pool of the run's own servers."""
    if loaded.policy_urls is None:
        return policy
    if pools is None:
        raise UnreachablePool(f"run {loaded.run_id} samples from servers of its own ({', '.join(loaded.policy_urls[:3])}); "
                              "expected a worker that reaches them (task_workers.context.WorkerContext.pool)")
    return pools(loaded.policy_urls)


def _play(loaded: _Loaded, kind: EnvironmentKind, opened: Opened, policy: PolicyClient | EpisodePolicy) -> Trajectory:
    """The agent loop from the opening message; the opening's artifacts lead the trajectory's."""
    ctx = LoopContext(kind=kind, task=opened.task, sandbox=opened.sandbox, policy=policy, limits=loaded.spec.limits,
                      sampling=loaded.sampling, tool_parser=loaded.spec.tool_parser, seed=loaded.seed,
                      require_version=loaded.training or loaded.expect_version is not None,
                      run=loaded.run_id if loaded.training else None, expect_version=loaded.expect_version)
    program = getattr(kind, "program", None)
    if program is not None:  # an agent program plays instead of the tool loop (environments/agent_program)
        trajectory = run_program(ctx, program=program, instruction=opened.text)
    else:
        trajectory = run_agent_loop(ctx, prompt_ids=initial_prompt(ctx, instruction=opened.text))
    trajectory.artifacts[:0] = [ArtifactRecord(None, art.name, art.media_type, art.data) for art in opened.artifacts]
    return trajectory


def _screened(loaded: _Loaded, trajectory: Trajectory, verdict: Verdict, *, worker: str,
              timings: dict[str, float]) -> tuple[Verdict, Unscored | None]:
    """The verdict with the platform's own flags (a rewarded canary, a judge's answer in the episode's text)
    and the learned layers; Unscored when a learned layer's server never answered."""
    if loaded.canary and canary_score(verdict.components) > 0:  # no honest change earns this: a hack
        verdict = replace(verdict, flags=sorted({*verdict.flags, EpisodeFlag.CANARY_REWARDED.value}))
    if loaded.spec.verifier.judge is not None:  # what a judge of either mode will read: no answer-like lines
        verdict = flag_injection(verdict, transcript=transcript_of(trajectory.turns))
    if not has_learned_layers(loaded.spec):
        return verdict, None
    judged = time.monotonic()  # after the sandbox went back: text only
    try:
        return with_learned(loaded.spec, instruction=loaded.instruction, turns=trajectory.turns, verdict=verdict), None
    except JudgeFault as fault:  # asked again from the store (learned.py): playing again would not help
        return verdict, Unscored(reason=fault.reason, message=str(fault), worker=worker)
    finally:
        timings["judge"] = time.monotonic() - judged


def _stored(loaded: _Loaded, trajectory: Trajectory, verdict: Verdict, unscored: Unscored | None, *,
            sandbox_id: str | None, timings: dict[str, float], worker: str) -> EpisodeOutcome:
    """Store the episode with its reward, derived once (environments.rewards.total); under a pairwise
    judge, judge the group if this was its last episode, before the trainer may claim it."""
    reward = total(verdict.layers, verdict.flags, loaded.spec)
    with session_scope() as session:
        stored = store_episode(session, episode_id=loaded.episode_id, trajectory=trajectory, verdict=verdict,
                               reward=reward, sandbox_id=sandbox_id,
                               timings={k: round(v, 4) for k, v in timings.items()}, unscored=unscored)
    if unscored is not None:
        logger.warning("episode %s played, awaiting its judge (%s): %s", loaded.episode_id, unscored.reason,
                       unscored.message)
        return EpisodeOutcome(loaded.episode_id, stored, trajectory.termination, None)
    logger.info("episode %s ended: %s reward=%s stored=%s", loaded.episode_id, trajectory.termination, reward.value,
                stored)
    if _is_pairwise(loaded.spec):
        judge_finished_group(loaded.group_id, worker=worker)
    return EpisodeOutcome(loaded.episode_id, stored, trajectory.termination, reward.value)


def _is_pairwise(spec: EnvironmentSpec) -> bool:
    return spec.verifier.judge is not None and spec.verifier.judge.mode == "pairwise"
