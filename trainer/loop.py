"""The trainer of one run: resume, then step until the run ends.

    crucible trainer --run 7 --policy-url http://127.0.0.1:8000/v1 --policy-dir /data/served-model

One step (see `train_one_step`): in ONE transaction, claim complete groups (row locks held) →
score → advantages → update (optimizer step) → checkpoint written as pending → the groups marked
consumed/dropped, each trained episode's advantage and score stored, the tasks' pass rates moved
and the training_steps row inserted → commit. Then the checkpoint is promoted, the weights loaded
into vLLM under a provisional tag and probed, and only then tagged and the policy version published
(a policy_versions row, runs.policy_version bumped). A failed probe rolls vLLM back to the previous
weights and tag, records why on the run (`runs.sync_error`) and raises. With a pool of replicas the
push, the probe and the tag reach every replica (trainer/sync.py): the version is published when
every replica left in rotation passed; one that failed is paused and named in `runs.sync_error`.

One trainer per run (a Postgres advisory lock; a second exits with TrainerAlreadyRunning). A step
whose loss or gradient norm is not finite is skipped: nothing of it is kept or checkpointed, its
groups are dropped as `non_finite` and `optim/skipped_steps` reports it. A policy replica that
reports a version other than the run's (restarted: "default") is re-synced before the next step.

A step trains on `batch_size` groups. Groups it drops (zero variance, past the staleness cap, no
trainable sample: a core.termination.DropReason, stored on the group with the step) are
committed as dropped at once so the controller dispatches replacements (DAPO dynamic sampling); a
step trains on fewer only when no more can come (nothing in flight and the run stopped or its
budget spent).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from core.db import get_engine, lost_connection, session_factory
from core.errors import ConfigError, CrucibleError
from core.models import Run, RunEnvironment, TrainingStep
from core.pools import check_pool_free, held_by
from core.schemas.run import Sampling, stored_run
from core.settings import get_settings
from core.termination import DropReason, RunStatus
from trainer import cost, faults, metrics
from trainer.checkpoint import CheckpointStore, TrainerState
from trainer.config import TrainerConfig
from trainer.engine import PolicyEngine, make_engine
from trainer.errors import NonFiniteStep, WeightSyncError
from trainer.probe import probe_tolerance
from trainer.ranks import INIT, REBUILD, STOP, UPDATE, FollowerSetup, LeaderEngine, Ranks, announce, leave
from trainer.selection import BatchPlan, Pacer, StalenessRule
from trainer.step import UpdateResult, advantages, generate, score, update
from trainer.store import (
    PassOutcome,
    TrainedValue,
    consumed_groups,
    get_run,
    hold_trainer_lock,
    last_step,
    mark_dropped,
    nothing_more_to_come,
    oldest_waiting_version,
    publish_version,
    record_step,
    record_sync_error,
    update_pass_rates,
)
from trainer.sync import Publisher, SyncReport

log = logging.getLogger(__name__)
FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED)
T = TypeVar("T")
_STOPPED = object()
"""What `Trainer._weathered` returns when it was stopped while waiting for the database."""


class CheckpointMismatch(CrucibleError):
    """The checkpoints on disk do not match the steps the database recorded."""


@dataclass(frozen=True)
class StepOutcome:
    step: int
    version: int
    groups: int
    dropped: int
    metrics: dict[str, float | None]


def run_sampling(run: Run) -> Sampling:
    """The sampling settings episodes were drawn with; ConfigError if the trainer cannot reproduce them
    (a temperature of 0, top_p < 1, top_k, min_p, penalties): its logprobs would not be the sampler's."""
    sampling = stored_run(run.config, run_id=run.id).sampling
    if problems := sampling.unreproducible():
        raise ConfigError(f"run {run.id} config.sampling: " + "; ".join(problems))
    return sampling


def sampling_temperature(run: Run) -> float:
    """The temperature episodes were sampled at (validated: > 0 and reproducible)."""
    return run_sampling(run).temperature


def load_policy(model_dir: str, *, config: TrainerConfig) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    pretrained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if config.optimizer.activation_checkpointing:  # non-reentrant: works with frozen inputs (LoRA) and ZeRO
        pretrained.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model: torch.nn.Module = pretrained
    if config.lora is not None:
        from trainer.lora import apply_lora

        model = apply_lora(model, config=config.lora)
    return model


class Trainer:
    def __init__(
        self, *, run_id: int, publisher: Publisher, checkpoint_root: Path, db: Engine | None = None,
        poll_s: float = 1.0,
    ) -> None:
        self.run_id = run_id
        self.publisher = publisher
        if publisher is not None:  # (None: tests of the loop that publish nothing)
            publisher.run_id = run_id  # every label it pushes names this run (core.versions)
        self.poll_s = poll_s
        self._sessions = session_factory(db)
        self._lock = hold_trainer_lock(db or get_engine(), run_id=run_id)  # before any work: one trainer per run
        try:
            self._load_settings()
            self._hold_pool()
        except BaseException:
            self._lock.release()
            raise
        torch.manual_seed(self.config.seed)
        self.ranks = self._join_ranks()
        self.engine: PolicyEngine = self._make_engine()
        self.reference = _reference(self.model_dir, config=self.config)
        self.cost = cost.CostMeter(policy=self.engine.module, reference=self.reference)  # cost/* per step
        self.checkpoints = CheckpointStore(checkpoint_root, keep=self.config.keep_checkpoints,
                                           keep_every=self.config.keep_every)
        self.step = 0
        self.consumed = 0
        self._dropped_while_waiting = BatchPlan()  # reported with the next step's metrics
        self._skipped_steps = 0  # non-finite steps since the last recorded one, reported with it

    def _hold_pool(self) -> None:
        """PoolHeld when a live trainer of another run holds one of this trainer's servers (checked once
        this trainer holds its own lock, so of two starting at once the later sees the earlier); then
        every push and re-sync refuses a server whose label names such a run (core.pools)."""
        if self.publisher is None:  # (tests of the loop that publish nothing)
            return
        with self._sessions() as session:
            check_pool_free(session, urls=[replica.server.api_url for replica in self.publisher.replicas],
                            run_id=self.run_id)

        def live(runs: list[int]) -> list[int]:
            with self._sessions() as session:
                return held_by(session, runs, run_id=self.run_id)
        self.publisher.held_by = live

    def _load_settings(self) -> None:
        with self._sessions() as session:
            run = get_run(session, run_id=self.run_id)
            self.model_dir, self.batch_size = run.model, run.batch_size
            self.max_staleness, self.temperature = run.max_staleness, sampling_temperature(run)
            # Resolved at launch (controller.runs.resolve_config); a run launched before they existed: the defaults.
            stored = stored_run(run.config, run_id=self.run_id)
            self.staleness_rule = StalenessRule.for_bound(run.max_staleness,
                                                          max_token_staleness=stored.max_token_staleness)
            self.lag_wait_s = stored.lag_wait_s
            self.pacer = Pacer(self.staleness_rule, self.lag_wait_s)
            self.config = stored.trainer
            if self.config.seed is None:  # resolved at launch; a run stored before that: the run's own seed
                self.config = self.config.model_copy(update={"seed": stored.seed})
            environments = session.execute(select(func.count()).where(RunEnvironment.run_id == self.run_id)).scalar_one()
            # Decided once for the run: a batch that happens to hold one environment is normalised alike.
            self.normalization = self.config.loss.normalization_for(environments=max(int(environments), 1))
            self.curriculum = stored.curriculum
            if self.publisher is not None:  # the served dtype's tolerance unless the run gives its own
                self.publisher.tolerance = self.config.probe_tolerance or probe_tolerance(self.config.served_dtype)

    def _join_ranks(self) -> Ranks | None:
        """Under a launcher with several ranks (`crucible trainer --nproc N`), join the process group and
        tell the followers how to build their engine; this rank (0) then leads every step."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        if self.config.deepspeed is None:
            raise ConfigError(f"run {self.run_id}: several trainer ranks shard the model with DeepSpeed ZeRO: "
                              "expected config.trainer.deepspeed (e.g. {stage: 3}), got none")
        from trainer.engine_deepspeed import join_process_group

        join_process_group()
        ranks = Ranks.current()
        assert ranks is not None and ranks.rank == 0, "followers run trainer.ranks.follow, not the Trainer"
        announce(INIT, FollowerSetup(model_dir=self.model_dir, config=self.config.model_dump(mode="json"),
                                     temperature=self.temperature))
        log.info("run %d: leading %d trainer ranks", self.run_id, ranks.world)
        return ranks

    def _make_engine(self) -> PolicyEngine:
        """The run's starting weights and a fresh optimizer (every rank builds its shard at once)."""
        engine = make_engine(model=load_policy(self.model_dir, config=self.config), config=self.config)
        return LeaderEngine(engine) if self.ranks else engine

    # ---- resume -------------------------------------------------------------------------------
    def resume(self) -> None:
        """Match the checkpoints to the database, load the newest, and make vLLM serve it."""
        self._resume(fresh=True)

    def _resume(self, *, fresh: bool) -> None:
        """`resume`; not `fresh`: the engine may have moved past the newest checkpoint (a step whose
        transaction was lost), so with no checkpoint yet it is rebuilt from the run's starting weights."""
        with self._sessions() as session:
            recorded = last_step(session, run_id=self.run_id)
            self.checkpoints.reconcile(recorded_step=recorded)
            latest = self.checkpoints.latest()
            found = latest[1].step if latest else 0
            if found != recorded:
                raise CheckpointMismatch(
                    f"run {self.run_id}: the database recorded {recorded} training steps but the newest "
                    f"checkpoint under {self.checkpoints.root} is step {found}; restore the checkpoint directory")
            if latest is not None:
                self.checkpoints.load(latest[0], engine=self.engine)
                self.step, self.consumed = latest[1].step, latest[1].consumed_groups
            elif not fresh:
                self._restore_engine()
                self.step = self.consumed = 0
            in_db = consumed_groups(session, run_id=self.run_id, through_step=self.step)
            if in_db != self.consumed:
                raise CheckpointMismatch(f"run {self.run_id}: checkpoint step {self.step} consumed "
                                         f"{self.consumed} groups, the database says {in_db}")
            version = get_run(session, run_id=self.run_id).policy_version
        log.info("run %d: resuming at step %d (policy version %d)", self.run_id, self.step, version)
        if version not in (self.step, self.step - 1):
            raise CheckpointMismatch(f"run {self.run_id}: policy version {version} does not follow step {self.step}")
        self._publish(step=self.step, publish=version < self.step)

    # ---- one step -----------------------------------------------------------------------------
    def train_one_step(self) -> StepOutcome | None:
        """One step if a batch is ready; None (after committing any drops) if not."""
        started = time.perf_counter()
        with self._sessions() as session:
            plan = generate(session, run_id=self.run_id, version=self.step, rule=self.staleness_rule,
                            batch_size=self.batch_size, loss=self.config.loss)
            if not self._batch_ready(session, plan):
                mark_dropped(session, dropped=plan.dropped, step=self.step)
                session.commit()
                self._remember_drops(plan)
                return None
            timings = {"generate": time.perf_counter() - started}
            try:
                result = self._learn(plan, timings)
            except NonFiniteStep as error:
                self._skip(session, plan, error)
                return None
            outcome = self._commit(session, plan, result, timings)
        faults.crash_point("commit", step=outcome.step)
        self.checkpoints.promote(outcome.step)
        faults.crash_point("promote", step=outcome.step)
        self._publish(step=outcome.step, publish=True)
        return outcome

    def _skip(self, session: Session, plan: BatchPlan, error: NonFiniteStep) -> None:
        """A non-finite loss or gradient norm: keep nothing of the step (the weights and optimizer go
        back to the last checkpoint), drop its groups as `non_finite`, report it with the next step."""
        log.error("run %d: step %d skipped, %s; its %d groups are dropped", self.run_id, self.step + 1, error,
                  len(plan.groups))
        self._restore_engine()
        for group in plan.groups:
            plan.dropped[group.id] = DropReason.NON_FINITE
        plan.groups = []
        mark_dropped(session, dropped=plan.dropped, step=self.step)
        session.commit()
        self._remember_drops(plan)
        self._skipped_steps += 1

    def _restore_engine(self) -> None:
        latest = self.checkpoints.latest()
        if latest is not None:
            self.checkpoints.load(latest[0], engine=self.engine)
        else:  # before the first checkpoint: the run's starting weights and a fresh optimizer
            if self.ranks:
                announce(REBUILD)
            self.engine = self._make_engine()

    def _remember_drops(self, plan: BatchPlan) -> None:
        """Keep what the committed drops looked like (their rewards, their reasons) for the next step's
        metrics: leaving solved groups out of `reward/*` would bias it low."""
        earlier = self._dropped_while_waiting
        earlier.dropped.update(plan.dropped)
        earlier.scored += [sample for sample in plan.scored if sample.group_id in plan.dropped]
        earlier.examined += len(plan.dropped)

    def _metrics_view(self, plan: BatchPlan) -> BatchPlan:
        """The step's plan plus the groups dropped while it waited (for metrics only; forgotten once the
        step is committed)."""
        earlier = self._dropped_while_waiting
        return dataclasses.replace(plan, dropped={**earlier.dropped, **plan.dropped},
                                   scored=earlier.scored + plan.scored, examined=earlier.examined + plan.examined)

    def _batch_ready(self, session: Session, plan: BatchPlan) -> bool:
        if len(plan.groups) >= self.batch_size:
            return self._paced(session, plan)
        if plan.dropped or not plan.groups:  # commit the drops first: the controller replaces them
            return False
        return nothing_more_to_come(session, run_id=self.run_id, claimed={group.id for group in plan.groups})

    def _paced(self, session: Session, plan: BatchPlan) -> bool:
        """Whether this step leaves no running group past the hard cap (trainer.selection.Pacer): a step
        waits for such a group at most `lag_wait_s`, once per group, then goes ahead."""
        batch = {group.id for group in plan.groups} | set(plan.dropped)
        oldest = oldest_waiting_version(session, run_id=self.run_id, batch=batch)
        waiting = self.pacer.waiting_since
        if self.pacer.go(version=self.step, oldest_waiting=oldest, now=time.monotonic()):
            if waiting is not None and self.pacer.gave_up_through is not None:
                log.warning("run %d: step %d waited %.0f s for a group dispatched at version %s; going ahead (it "
                            "may be dropped as stale_cap; not waited for again)", self.run_id, self.step + 1,
                            time.monotonic() - waiting, oldest)
            return True
        if waiting is None:
            log.info("run %d: step %d waits for a group dispatched at version %s (hard cap %d)", self.run_id,
                     self.step + 1, oldest, self.staleness_rule.stale_cap_lag)
        return False

    def _learn(self, plan: BatchPlan, timings: dict[str, float]) -> UpdateResult:
        started = time.perf_counter()
        score(plan, normalization=self.normalization)
        scored = time.perf_counter()
        advantages(plan, loss=self.config.loss)
        timings.update(score=scored - started, advantages=time.perf_counter() - scored)
        self.cost.begin()
        if self.ranks:  # the followers take their share of the same samples (trainer.ranks)
            announce(UPDATE, (self.step + 1, plan.samples))
        result = update(self.engine, plan.samples, config=self.config, temperature=self.temperature,
                        reference=self.reference)
        timings["update"] = result.seconds
        faults.crash_point("update", step=self.step + 1)
        return result

    def _commit(self, session: Session, plan: BatchPlan, result: UpdateResult,
                timings: dict[str, float]) -> StepOutcome:
        step = self.step + 1
        group_ids = [group.id for group in plan.groups]
        state = TrainerState(run_id=self.run_id, step=step, policy_version=step,
                             consumed_groups=self.consumed + len(group_ids), last_group_ids=group_ids)
        started = time.perf_counter()
        self.checkpoints.write_pending(engine=self.engine, state=state)
        timings["checkpoint"] = time.perf_counter() - started
        faults.crash_point("pending", step=step)
        view = self._metrics_view(plan)
        values = metrics.step_metrics(plan=view, result=result, timings=timings)
        values[metrics.SKIPPED_STEPS] = float(self._skipped_steps)
        values.update(self.cost.record(session, samples=plan.samples, update_seconds=result.seconds,
                                       update_tokens=result.tokens_processed, timings=timings))
        started = time.perf_counter()
        trained = [TrainedValue(episode_id=s.episode_id, advantage=s.advantage, score=s.score) for s in plan.samples]
        record_step(session, run_id=self.run_id, step=step, policy_version=step, consumed=group_ids,
                    dropped=plan.dropped, metrics=values, trained=trained)
        update_pass_rates(session, run_id=self.run_id, curriculum=self.curriculum, outcomes=[
            PassOutcome(s.task_id, s.reward, s.components, s.policy_version, s.seconds, s.flags) for s in view.scored])
        session.commit()
        values[metrics.timing_key("commit")] = round(time.perf_counter() - started, 6)
        self.step, self.consumed = step, state.consumed_groups
        self._dropped_while_waiting, self._skipped_steps = BatchPlan(), 0  # reported with this step
        log.info("run %d: step %d trained on %d groups (%d dropped), loss %s, reward %s", self.run_id, step,
                 len(group_ids), len(plan.dropped), values.get(metrics.LOSS), values.get(metrics.REWARD_MEAN))
        return StepOutcome(step=step, version=step, groups=len(group_ids), dropped=len(plan.dropped),
                           metrics=values)

    # ---- sync and publish ---------------------------------------------------------------------
    def _publish(self, *, step: int, publish: bool) -> None:
        """Push + probe the weights as version `step` on every replica; when `publish`, record the version
        after. A failed sync (no replica passed: all rolled back) is recorded on the run before it
        propagates; replicas that failed while others passed are paused and named on the run."""
        report = self._synced(step, lambda: self.publisher.push(engine=self.engine, version=step))
        assert report is not None and report.probe is not None  # push raises unless a replica serves `step`
        log.info("run %d: version %d synced in %.3f s, probe %s", self.run_id, step, report.seconds, report.probe)
        if not publish:
            return
        extra = metrics.sync_metrics(seconds=report.seconds, probe_kl=report.probe.kl,
                                     probe_diff=report.probe.mean_abs_diff)
        path = self.checkpoints.root / f"step-{step:06d}"
        with self._sessions() as session:
            record_sync_error(session, run_id=self.run_id, error=_paused_replicas(step, report))
            publish_version(session, run_id=self.run_id, version=step, step=step, checkpoint_path=str(path),
                            sync_seconds=report.seconds, probe_kl=report.probe.kl)
            row = session.execute(select(TrainingStep).where(
                TrainingStep.run_id == self.run_id, TrainingStep.step == step)).scalar_one_or_none()
            if row is not None:
                row.metrics = {**row.metrics, **extra}
            session.commit()

    def _synced(self, step: int, sync: Callable[[], SyncReport | None]) -> SyncReport | None:
        """`sync()`, its WeightSyncError recorded on the run (`runs.sync_error`) before it propagates."""
        try:
            return sync()
        except WeightSyncError as error:
            with self._sessions() as session:
                record_sync_error(session, run_id=self.run_id, error=f"version {step}: {error}"[-4000:])
                session.commit()
            raise

    # ---- the loop -----------------------------------------------------------------------------
    def resync_if_needed(self) -> bool:
        """Re-push the current weights to every replica that does not report the run's version (a
        restarted vLLM says "default" and serves whatever its directory held; a paused one is due for
        a retry); True if it re-synced any."""
        report = self._synced(self.step, lambda: self.publisher.resync(engine=self.engine, version=self.step))
        if report is None:
            return False
        log.warning("run %d: re-synced version %d to %s%s", self.run_id, self.step, list(report.replicas),
                    f"; still paused: {report.failed}" if report.failed else "")
        return True

    def finished(self) -> bool:
        with self._sessions() as session:
            return get_run(session, run_id=self.run_id).status in FINISHED

    def run(self, *, max_steps: int | None = None, stop: threading.Event | None = None) -> int:
        """Resume, then train until the run finishes, `max_steps` more steps are done or `stop` is set.
        A lost database connection is weathered (`_weathered`): the step in hand is trained again or,
        if its commit reached the database, kept; never both."""
        stop = stop or threading.Event()
        if self._weathered(lambda: self._resume(fresh=True), stop) is _STOPPED:
            return 0
        start = self.step  # steps are counted by what was committed: a retried pass may have committed one
        while not stop.is_set() and (max_steps is None or self.step - start < max_steps):
            outcome = self._weathered(self._one_pass, stop)
            if outcome is _STOPPED:
                break
            if outcome is not None:
                continue
            finished = self._weathered(self.finished, stop)
            if finished is _STOPPED or finished:
                break
            stop.wait(self.poll_s)
        return self.step - start

    def _one_pass(self) -> StepOutcome | None:
        if self._lock.ensure():
            log.warning("run %d: the trainer lock's connection was lost; taken again", self.run_id)
        self.resync_if_needed()
        return self.train_one_step()

    def _weathered(self, work: Callable[[], T], stop: threading.Event) -> T | object:
        """`work()`, retried while the database connection is lost (core.db.lost_connection). Each retry
        first takes the trainer lock again and matches the engine and the checkpoints to what the
        database recorded (`_resume`): a step whose transaction was lost is trained again from the last
        checkpoint, one whose commit got through is kept. Raises after `db_outage_s` of failures in a
        row; `_STOPPED` if `stop` was set while it waited."""
        give_up = time.monotonic() + get_settings().db_outage_s
        wait, recover = 0.5, False
        while True:
            try:
                if recover:
                    self._lock.ensure()
                    self._resume(fresh=False)
                    recover = False
                return work()
            except Exception as error:
                if not lost_connection(error) or time.monotonic() + wait > give_up:
                    raise
                log.warning("run %d: the database connection was lost (%s); retrying in %.1f s", self.run_id,
                            str(error).splitlines()[0], wait)
                recover = True
            if stop.wait(wait):
                return _STOPPED
            wait = min(wait * 2, 10.0)

    def close(self) -> None:
        if self.ranks:
            try:
                announce(STOP)
                leave()
            except Exception:  # a follower already gone: the launcher ends the rest
                log.warning("run %d: could not tell the follower ranks to stop", self.run_id, exc_info=True)
        self.publisher.close()
        self._lock.release()


def _reference(model_dir: str, *, config: TrainerConfig) -> torch.nn.Module | None:
    """The frozen reference policy for the KL term (None when the run has no KL)."""
    if config.loss.kl_beta <= 0:
        return None
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return reference.requires_grad_(False)


def build_follower(setup: FollowerSetup) -> tuple[PolicyEngine, torch.nn.Module | None]:
    """A follower rank's engine (its shard) and KL reference, as rank 0 builds its own."""
    config = TrainerConfig.model_validate(setup.config)
    torch.manual_seed(config.seed)
    return make_engine(model=load_policy(setup.model_dir, config=config), config=config), \
        _reference(setup.model_dir, config=config)


def _paused_replicas(step: int, report: SyncReport) -> str | None:
    """What `runs.sync_error` says after a publish: the replicas left paused, if any."""
    if not report.failed:
        return None
    why = "; ".join(f"{name}: {error}" for name, error in report.failed.items())
    return f"version {step} published on {len(report.replicas)} replicas; paused: {why}"[-4000:]
