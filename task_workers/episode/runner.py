"""One episode, end to end:

    claim → lease a sandbox → set the task up → agent loop → verify → store episode + turns in ONE
    transaction → the sandbox is reset and returned to its pool (or destroyed).

Infrastructure faults (sandbox, policy) propagate as InfrastructureFault for the Celery task to
retry; the agent's own outcomes are stored. Running the same episode twice stores one copy. Under a
pairwise judge, the worker that stores a group's last episode then judges the group (group_judge.py); a
redelivered episode that has already ended judges its group if that is still to do.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sqlalchemy import select

from core.canaries import canary_score, is_canary
from core.db import session_scope
from core.episode_text import render_turns
from core.errors import ConfigError, CrucibleError
from core.flags import EpisodeFlag
from core.models import Environment, Episode, Task
from core.schemas.run import Sampling, stored_checkpoint, stored_policy_urls, stored_sampling, stored_seed
from core.seeds import episode_seed
from core.termination import RunPurpose, TerminationReason
from environments.base import (
    Artifact,
    EnvironmentKind,
    GraderFault,
    LayerResult,
    Sandbox,
    TaskRefused,
    ToolCall,
    Verdict,
)
from environments.judge import LAYER as JUDGE_LAYER
from environments.judge import Judge, LearnedRewardUnavailable, flag_injection, transcript_of
from environments.registry import get_kind
from environments.reward_model_layer import LAYER as RM_LAYER
from environments.reward_model_layer import score_episode
from environments.rewards import FlagPolicy, total
from environments.service import spec_of
from environments.spec import EnvironmentSpec, JudgeConfig
from task_workers.episode.errors import JudgeFault, SandboxFault, TaskRefusedFault, UnreachablePool
from task_workers.episode.group_judge import group_of, judge_finished_group
from task_workers.episode.loop import LoopContext, initial_prompt, run_agent_loop
from task_workers.episode.persist import Unscored, claim_episode, store_episode
from task_workers.episode.trajectory import ArtifactRecord, Trajectory
from task_workers.policy.client import PolicyClient
from task_workers.policy.pool import PolicyPool

logger = logging.getLogger(__name__)


class SandboxProvider(Protocol):
    """Where episodes get sandboxes: a leased one for the agent, a fresh one for grading."""

    def lease(self, *, spec: EnvironmentSpec, run_id: int, episode_id: int) -> AbstractContextManager[Any]: ...

    def fresh(self, *, spec: EnvironmentSpec, run_id: int | None,
              episode_id: int | None) -> AbstractContextManager[Sandbox]: ...


@dataclass(frozen=True)
class EpisodeOutcome:
    episode_id: int
    stored: bool
    termination: TerminationReason | None
    reward: float | None


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
    seed = episode_seed(run_seed=stored_seed(config, run_id=episode.run_id), group_index=group_index,
                        sample_index=episode.sample_index)
    checkpoint = stored_checkpoint(config, run_id=episode.run_id)
    own = stored_policy_urls(config, run_id=episode.run_id)
    return (stored_sampling(config, run_id=episode.run_id), purpose == RunPurpose.TRAIN,
            None if checkpoint is None else checkpoint.tag, seed, own)


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
        group_id = group_of(episode_id)
        grouped = group_id is not None and judge_finished_group(group_id, worker=worker)  # a retry after an outage
        logger.info("episode %s already ended; %s", episode_id, f"judged group {group_id}" if grouped else "nothing to do")
        return EpisodeOutcome(episode_id, False, None, None)
    if loaded.policy_urls is not None:
        if pools is None:
            raise UnreachablePool(f"run {loaded.run_id} samples from servers of its own ({', '.join(loaded.policy_urls[:3])}); "
                              "expected a worker that reaches them (task_workers.context.WorkerContext.pool)")
        policy = pools(loaded.policy_urls)
    kind = get_kind(loaded.spec.kind)(loaded.spec)
    task = kind.parse_task(loaded.payload)
    try:  # a task may name its own image (a SWE-bench instance's): every sandbox of the episode is of it
        task, spec = prepare_task(kind, task, spec=loaded.spec, sandboxes=sandboxes, run_id=loaded.run_id,
                                  episode_id=episode_id)
        loaded = replace(loaded, spec=spec)
    except (TaskRefused, ConfigError) as error:
        raise TaskRefusedFault(f"task refused: {error}") from error
    except (RuntimeError, CrucibleError) as error:
        raise SandboxFault(f"task preparation failed: {error}") from error
    with ExitStack() as stack:
        episode_policy = stack.enter_context(policy.episode()) if isinstance(policy, PolicyPool) else policy
        try:
            sandbox = stack.enter_context(sandboxes.lease(spec=loaded.spec, run_id=loaded.run_id, episode_id=episode_id))
        except CrucibleError as error:
            raise SandboxFault(f"no sandbox: {error}") from error
        leased = time.monotonic()
        try:
            kind.setup(sandbox=sandbox, task=task)
        except TaskRefused as error:
            raise TaskRefusedFault(f"task refused: {error}") from error
        except (RuntimeError, CrucibleError) as error:
            raise SandboxFault(f"task setup failed: {error}") from error
        set_up = time.monotonic()
        instruction = loaded.instruction
        opening_artifacts: tuple[Artifact, ...] = ()
        try:  # a browser's first message comes from its sandbox (the goal and the first page)
            opening = kind.opening(sandbox=sandbox, task=task, instruction=loaded.instruction)
        except (RuntimeError, CrucibleError) as error:
            raise SandboxFault(f"the first observation failed: {error}") from error
        if opening is not None:
            instruction, opening_artifacts = opening.text, opening.artifacts
        ctx = LoopContext(kind=kind, task=task, sandbox=sandbox, policy=episode_policy, limits=loaded.spec.limits,
                          sampling=loaded.sampling, tool_parser=loaded.spec.tool_parser, seed=loaded.seed,
                          require_version=loaded.training or loaded.expect_version is not None,
                          run=loaded.run_id if loaded.training else None, expect_version=loaded.expect_version)
        trajectory = run_agent_loop(ctx, prompt_ids=initial_prompt(ctx, instruction=instruction))
        trajectory.artifacts[:0] = [ArtifactRecord(None, art.name, art.media_type, art.data)
                                    for art in opening_artifacts]
        verdict, verify_s = _verify(kind, sandbox, task, trajectory, sandboxes, loaded)
        sandbox_id = getattr(sandbox, "id", None)
    timings = {**trajectory.timings, "lease": leased - started, "setup": set_up - leased, "verify": verify_s,
               "total": time.monotonic() - started}
    if loaded.canary and canary_score(verdict.components) > 0:  # no honest change earns this: a hack
        verdict = replace(verdict, flags=sorted({*verdict.flags, EpisodeFlag.CANARY_REWARDED.value}))
    if loaded.spec.verifier.judge is not None:  # what a judge of either mode will read: no answer-like lines
        verdict = flag_injection(verdict, transcript=transcript_of(trajectory.turns))
    unscored = None
    if _pointwise_judge(loaded.spec) or loaded.spec.verifier.reward_model:  # after the sandbox went back: text only
        judged = time.monotonic()
        try:
            verdict = _learned(loaded, trajectory, verdict)
        except JudgeFault as fault:  # asked again by its client, with back-off; playing again would not help
            unscored = Unscored(reason=fault.reason, message=str(fault), worker=worker)
        timings["judge"] = time.monotonic() - judged
        timings["total"] = time.monotonic() - started
    reward = total(verdict.layers, verdict.flags, loaded.spec)
    with session_scope() as session:
        stored = store_episode(session, episode_id=episode_id, trajectory=trajectory, verdict=verdict,
                               sandbox_id=sandbox_id, timings={k: round(v, 4) for k, v in timings.items()},
                               unscored=unscored)
    if unscored is not None:
        logger.warning("episode %s played but not scored (%s): %s", episode_id, unscored.reason, unscored.message)
        return EpisodeOutcome(episode_id, stored, unscored.reason, None)
    logger.info("episode %s ended: %s reward=%s stored=%s", episode_id, trajectory.termination,
                reward.value, stored)
    if _is_pairwise(loaded.spec):  # if it was the group's last: compare them all before the trainer may claim it
        judge_finished_group(loaded.group_id, worker=worker)
    return EpisodeOutcome(episode_id, stored, trajectory.termination, reward.value)


def prepare_task(kind: EnvironmentKind, task: Any, *, spec: EnvironmentSpec, sandboxes: SandboxProvider,
                 run_id: int | None, episode_id: int | None) -> tuple[Any, EnvironmentSpec]:
    """The task as its episode's sandboxes need it, and the spec they run under (EnvironmentSpec.for_task).
    The kind's `prepare` step (code_repo: export the repository a task's own image holds) runs in sandboxes
    of an image that hide nothing and that no agent uses. ConfigError when the environment does not allow
    the image the task names: checked first, so no sandbox of such an image is made."""
    episode_spec = spec.for_task(task)

    def open_image(image: str) -> AbstractContextManager[Sandbox]:
        return sandboxes.fresh(spec=spec.on_image(image), run_id=run_id, episode_id=episode_id)

    return kind.prepare(task=task, open_image=open_image), episode_spec


def _learned(loaded: _Loaded, trajectory: Trajectory, verdict: Verdict) -> Verdict:
    """The verdict with the learned layers the spec names added — the judge's, the reward model's (each
    counts with its weight in environments.rewards.total). An episode a hack monitor zeroed is sent to
    neither (nothing they say could count). A server that does
    not answer (after its client's retries, with back-off) is JudgeFault, never a zero reward: the caller
    keeps the episode unscored (judge_error)."""
    verifier = loaded.spec.verifier
    judge_config = _pointwise_judge(loaded.spec)  # a pairwise judge scores the group once it has ended
    names = [name for name, config in ((JUDGE_LAYER, judge_config), (RM_LAYER, verifier.reward_model)) if config]
    if FlagPolicy.of(verifier).zeroes(verdict.flags):
        skipped = [LayerResult(name=name, score=0.0, passed=False, detail="not run: a hack monitor flagged the episode")
                   for name in names]
        return dataclasses.replace(verdict, layers=[*verdict.layers, *skipped])
    layers = []
    try:
        if judge_config is not None:
            judge = Judge(judge_config)
            try:
                layers.append(judge.pointwise(instruction=loaded.instruction, transcript=transcript_of(trajectory.turns)))
            finally:
                judge.close()
        if verifier.reward_model is not None:
            response = render_turns([(turn.completion_text, turn.observation) for turn in trajectory.turns])
            layers.append(score_episode(verifier.reward_model, prompt=loaded.instruction, response=response))
    except LearnedRewardUnavailable as error:
        raise JudgeFault(str(error)) from error
    return dataclasses.replace(verdict, layers=[*verdict.layers, *layers])


def _pointwise_judge(spec: EnvironmentSpec) -> JudgeConfig | None:
    judge = spec.verifier.judge
    return judge if judge is not None and judge.mode == "pointwise" else None


def _is_pairwise(spec: EnvironmentSpec) -> bool:
    return spec.verifier.judge is not None and spec.verifier.judge.mode == "pairwise"


def _verify(kind: Any, sandbox: Sandbox, task: Any, trajectory: Trajectory, sandboxes: SandboxProvider,
            loaded: _Loaded) -> tuple[Verdict, float]:
    started = time.monotonic()

    def open_fresh() -> AbstractContextManager[Sandbox]:
        return sandboxes.fresh(spec=loaded.spec, run_id=loaded.run_id, episode_id=loaded.episode_id)

    # What the agent did is scored by the verifier; only the machine's faults (GraderFault, a sandbox
    # layer error) are infrastructure faults, retried and never trained on.
    actions = [ToolCall(turn.tool_call["name"], turn.tool_call.get("arguments", {}))
               for turn in trajectory.turns if turn.tool_call]
    try:
        verdict = kind.verify(sandbox=sandbox, task=task, submitted=trajectory.submitted, open_sandbox=open_fresh,
                              actions=actions)
    except (GraderFault, CrucibleError) as error:
        raise SandboxFault(f"verification failed: {error}") from error
    return verdict, time.monotonic() - started
