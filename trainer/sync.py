"""Push the engine's weights to every policy replica and prove each serves them (the probe).

    publisher = Publisher(replicas=[Replica(server=PolicyServer(...), syncer=make_weight_syncer("reload", ...)),
                                    ...], probe_ids=ids)       # or Publisher(server=..., syncer=...): one server
    report = publisher.push(engine=engine, version=8)   # WeightSyncError if no replica passed its probe
    publisher.resync(engine=engine, version=8)          # each loop: replicas not on the run's 8 are synced again

Order, on every replica at once (one thread each): load (served under a provisional label of its own
load, core.versions.Label) → probe → commit that load's label. The labels name `run_id`, the training
run the weights belong to (trainer.loop.Trainer sets it; None: a checkpoint evaluation's). The trainer's side of the probe is scored
once for all replicas.

When a probe (or a load, or the tag) fails on some replicas but passes on others, the failing ones
are quarantined BEFORE the passing ones are tagged: rolled back to their previous weights and tag,
then paused (`/pause?mode=keep`: vLLM queues every request and samples nothing), so the pool never
serves the new version on one replica beside unverified or old weights on another; the passing
replicas are tagged and the version is published (`SyncReport.failed` names the others). A training
run is not stopped by one bad replica out of many. When NO replica passed, every one that loaded is
rolled back (the previous weights serve again, everywhere, unpaused) and WeightSyncError is raised:
nothing is published — with one server, exactly the single-server behaviour.

Late joiners: `resync` reads every replica's tag; one not on the current version (restarted: vLLM
says "default"; quarantined and back) is synced and probed before it can count as serving it. A
quarantined replica is retried after `retry_s`, or at once if its tag changed since (it restarted).
An unreachable replica is skipped (workers already take it out of rotation); WeightSyncError only
when no replica serves the version at all. Each replica of the reload path needs its own model
directory (it rewrites it): see cli/trainer.py.

Workers must not sample from a paused replica: its requests wait, never answer with other weights.
(The worker pool takes a replica out of rotation when its requests fail or time out.)

The weights pushed are `engine.export_state_dict()`: full tensors under the checkpoint's names, LoRA
merged, ZeRO-3 gathered. The probe scores a fixed sequence with a plain model holding exactly those
weights (the engine's own module when that is already the case) and with vLLM.
"""
from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from core.errors import ConfigError
from core.pools import PoolHeld
from core.settings import public_url
from core.versions import Label
from trainer.engine import PolicyEngine
from trainer.errors import WeightSyncError
from trainer.lora import is_lora
from trainer.probe import DEFAULT_TOLERANCE, ProbeReport, trainer_logprobs, verify_server
from trainer.weight_sync import ServerControl, WeightSyncer

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class PolicyServer:
    """Where the policy is served: the OpenAI API root, the dev-route root, its model name and the
    directory it loaded (which the reload path rewrites)."""

    api_url: str
    base_url: str
    model_name: str
    model_dir: Path


@dataclass(frozen=True)
class Replica:
    """One policy server and the path that pushes weights into it."""

    server: PolicyServer
    syncer: WeightSyncer

    @property
    def name(self) -> str:
        """As workers name it in `turns.replica`: its API URL without credentials."""
        return public_url(self.server.api_url)


@dataclass(frozen=True)
class SyncReport:
    version: int
    seconds: float
    """Export + push, not the probe."""
    probe: ProbeReport | None
    """The worst (largest mean |Δlogprob|) of the replicas now serving `version`; None only from a
    `resync` whose every replica failed while others already served `version`."""
    replicas: tuple[str, ...] = ()
    """The replicas now serving `version`, verified."""
    failed: dict[str, str] = field(default_factory=dict)
    """Replica → why it failed; each is paused (quarantined) on its previous weights."""


class ExportedWeights(torch.nn.Module):
    """A state dict posing as a module, for `save_weights` (which reads `.config` and `.state_dict()`)."""

    def __init__(self, state: dict[str, torch.Tensor], config: Any) -> None:
        super().__init__()
        self._state = state
        self.config = config

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return self._state


class Publisher:
    def __init__(self, *, server: PolicyServer | None = None, syncer: WeightSyncer | None = None,
                 replicas: Sequence[Replica] | None = None, probe_ids: list[int],
                 tolerance: float = DEFAULT_TOLERANCE, retry_s: float = 30.0, silence_grace_s: float = 120.0) -> None:
        """`silence_grace_s`: how long every replica may fail to answer a re-sync's version check before the
        publisher gives up (a CPU server busy with a long batch missed one 10 s check, and a trainer exited)."""
        if replicas is None:
            if server is None or syncer is None:
                given = "server= alone" if server else "syncer= alone" if syncer else "neither"
                raise ConfigError(f"expected server= and syncer= (one policy server) or replicas=, got {given}")
            replicas = [Replica(server=server, syncer=syncer)]
        elif server is not None or syncer is not None:
            raise ConfigError("expected server= and syncer= or replicas=, got both")
        if not replicas:
            raise ConfigError("expected one or more policy replicas, got none")
        names = [replica.name for replica in replicas]
        if len(set(names)) != len(names):
            raise ConfigError(f"expected each policy replica once, got {names}")
        self.replicas = list(replicas)
        self.run_id: int | None = None
        """The training run whose weights it pushes: every label names it (None: a checkpoint evaluation's)."""
        self.held_by: Callable[[list[int]], list[int]] | None = None
        """Which of these runs (named by replicas' labels) have a live trainer (core.pools.held_by; set by
        trainer.loop.Trainer): a replica one of them holds is never pushed to."""
        self.probe_ids = probe_ids
        self.tolerance = tolerance
        self.retry_s = retry_s
        self.silence_grace_s = silence_grace_s
        self._silent_since: float | None = None
        self._probe_model: torch.nn.Module | None = None
        self._quarantined: dict[str, tuple[float, str | None]] = {}  # name → (paused at, tag left on)
        self._threads = ThreadPoolExecutor(max_workers=min(len(self.replicas), 32), thread_name_prefix="sync")

    @property
    def server(self) -> PolicyServer:
        """The first replica's server (the only one, for a single-server publisher)."""
        return self.replicas[0].server

    @property
    def syncer(self) -> WeightSyncer:
        """The first replica's syncer (the only one, for a single-server publisher)."""
        return self.replicas[0].syncer

    def _plain_model(self, engine: PolicyEngine, state: dict[str, torch.Tensor]) -> torch.nn.Module:
        """A plain Hugging Face model holding `state`: the engine's module if that is what it is."""
        module = engine.module
        sharded = hasattr(next(iter(module.parameters())), "ds_id")  # ZeRO-3 partitions parameters
        if not is_lora(module) and not sharded:
            return module
        if self._probe_model is None:
            base = module.get_base_model() if is_lora(module) else module  # type: ignore[operator]
            from transformers import AutoModelForCausalLM

            self._probe_model = AutoModelForCausalLM.from_config(copy.deepcopy(base.config)).eval()
        self._probe_model.load_state_dict(state)
        return self._probe_model

    def _each(self, replicas: Sequence[Replica], call: Callable[[Replica], T]) -> dict[str, T | WeightSyncError]:
        """`call` on every replica at once (one thread each): name → its result or why it failed."""
        def guarded(replica: Replica) -> T | WeightSyncError:
            try:
                return call(replica)
            except WeightSyncError as error:
                return error
            except Exception as error:  # a malformed answer from one server must not hide the others'
                log.exception("policy replica %s failed", replica.name)
                return WeightSyncError(f"{type(error).__name__}: {error}")
        results = list(self._threads.map(guarded, replicas))
        return {replica.name: result for replica, result in zip(replicas, results, strict=True)}

    def push(self, *, engine: PolicyEngine, version: int) -> SyncReport:
        """Every replica: load, probe, tag. WeightSyncError (all rolled back) when none passed; PoolHeld
        when a replica serves the weights of another run whose trainer is alive."""
        self._refuse_held(self.served_versions())
        return self._sync(engine=engine, version=version, targets=self.replicas, serving_already=False)

    def _refuse_held(self, tags: dict[str, str | WeightSyncError | None]) -> None:
        """PoolHeld when a replica's label names another run with a live trainer: two trainers on one
        server would push over each other (the server's own label: every spelling of its address)."""
        runs = {name: label.run for name, tag in tags.items()
                if isinstance(tag, str) and (label := Label.parse(tag)) is not None and label.run is not None
                and label.run != self.run_id}
        if not runs or self.held_by is None:
            return
        if live := self.held_by(sorted(set(runs.values()))):
            names = [name for name, run in runs.items() if run in live]
            raise PoolHeld(f"policy replicas {', '.join(names[:3])} serve the weights of run {live[0]}, whose trainer "
                           "is alive: a second trainer there would push over it; give this run servers of its own "
                           f"(policy_urls) or stop run {live[0]}'s trainer first")

    def _sync(self, *, engine: PolicyEngine, version: int, targets: Sequence[Replica],
              serving_already: bool) -> SyncReport:
        started = time.perf_counter()
        state = engine.export_state_dict()
        weights = ExportedWeights(state, getattr(engine.module, "config", None))
        labels = {r.name: Label.fresh(version, run=self.run_id) for r in targets}  # one nonce per load
        loads = self._each(targets, lambda r: r.syncer.load(model=weights, label=labels[r.name]))
        seconds = time.perf_counter() - started
        unloaded = {name: str(result) for name, result in loads.items() if isinstance(result, WeightSyncError)}
        loaded = [r for r in targets if r.name not in unloaded]
        reference = trainer_logprobs(model=self._plain_model(engine, state), token_ids=self.probe_ids)
        probes = self._each(loaded, lambda r: verify_server(
            trainer=reference, api_url=r.server.api_url, model_name=r.server.model_name, token_ids=self.probe_ids,
            tolerance=self.tolerance))
        refused = {name: str(result) for name, result in probes.items() if isinstance(result, WeightSyncError)}
        passed = [r for r in loaded if r.name not in refused]
        failed = unloaded | refused
        single = len(targets) == 1
        if not passed and not serving_already:  # nothing to publish: every replica back on the old weights
            for name, error in self._each(loaded, lambda r: r.syncer.rollback()).items():
                if isinstance(error, WeightSyncError):
                    log.error("policy replica %s: %s", name, error)
            self._quarantine([r for r in targets if r.name in unloaded], unloaded)
            again = ", the previous weights serve again" if not unloaded else ""
            raise WeightSyncError(f"version {version} not published{again}: {_describe(failed, single=single)}")
        self._quarantine([r for r in targets if r.name in failed], failed)  # before any replica says `version`
        commits = self._each(passed, lambda r: r.syncer.commit(label=labels[r.name]))
        untagged = {name: f"tagging version {version}: {result}" for name, result in commits.items()
                    if isinstance(result, WeightSyncError)}
        self._quarantine([r for r in passed if r.name in untagged], untagged)
        failed |= untagged
        serving = [r for r in passed if r.name not in untagged]
        if not serving and not serving_already:
            raise WeightSyncError(f"version {version} not published: {_describe(failed, single=single)}")
        for replica in serving:
            self._quarantined.pop(replica.name, None)
        reports = [result for r in serving if isinstance(result := probes[r.name], ProbeReport)]
        worst = max(reports, key=lambda report: report.mean_abs_diff) if reports else None
        return SyncReport(version=version, seconds=seconds, probe=worst,
                          replicas=tuple(r.name for r in serving), failed=failed)

    def _quarantine(self, replicas: Sequence[Replica], why: dict[str, str]) -> None:
        """Roll back (where it loaded) and pause: a failed replica samples nothing until it is re-synced."""
        def pause(replica: Replica) -> str | None:
            try:
                replica.syncer.rollback()
            except WeightSyncError as error:
                log.warning("policy replica %s: rollback failed (%s); pausing it anyway", replica.name, error)
            control = ServerControl(base_url=replica.server.base_url, timeout_s=30.0)
            try:
                control.pause()
                return control.version()
            finally:
                control.close()
        tags = self._each(replicas, pause)
        for replica in replicas:
            tag = tags[replica.name]
            if isinstance(tag, WeightSyncError):
                log.error("policy replica %s failed (%s) and could not be paused: %s", replica.name,
                          why[replica.name], tag)
                tag = None
            else:
                log.error("policy replica %s paused, out of rotation until re-synced: %s", replica.name,
                          why[replica.name])
            self._quarantined[replica.name] = (time.monotonic(), tag)

    def served_versions(self) -> dict[str, str | WeightSyncError | None]:
        """Each replica's tag now ("default" after a restart, until it is re-synced), or why it did not answer."""
        def version(replica: Replica) -> str | None:
            control = ServerControl(base_url=replica.server.base_url, timeout_s=10.0)
            try:
                return control.version()
            finally:
                control.close()
        return self._each(self.replicas, version)

    def resync(self, *, engine: PolicyEngine, version: int) -> SyncReport | None:
        """Sync the replicas not serving `version` (restarted, or quarantined and due for a retry);
        None when there were none. WeightSyncError when no replica serves `version` afterwards."""
        tags = self.served_versions()
        self._refuse_held(tags)
        serving = [r for r in self.replicas if self._serves(tags[r.name], version)]
        behind = [r for r in self.replicas if r not in serving and not isinstance(tags[r.name], WeightSyncError)]
        due = [r for r in behind if self._due(r, tags[r.name])]
        if not serving and not behind:
            if self._silent_since is None:
                self._silent_since = time.monotonic()
            if time.monotonic() - self._silent_since >= self.silence_grace_s:
                raise WeightSyncError("no policy replica answers: " + _describe(
                    {name: str(tag) for name, tag in tags.items()}, single=len(self.replicas) == 1))
            log.warning("no policy replica answered the version check (%s); asking again on the next pass",
                        "; ".join(f"{name}: {tag}" for name, tag in tags.items())[:500])
            return None
        self._silent_since = None
        if not due:
            return None
        log.warning("policy replicas %s report %s, expected %d (restarted or quarantined?): re-syncing",
                    [r.name for r in due], [tags[r.name] for r in due], version)
        return self._sync(engine=engine, version=version, targets=due, serving_already=bool(serving))

    def _serves(self, tag: object, version: int) -> bool:
        """Whether a replica's `tag` is a committed load of this publisher's run at `version`."""
        label = Label.parse(tag) if isinstance(tag, str) else None
        return label is not None and not label.provisional and (label.run, label.version) == (self.run_id, version)

    def _due(self, replica: Replica, tag: object) -> bool:
        if replica.name not in self._quarantined:
            return True
        paused_at, left_on = self._quarantined[replica.name]
        return time.monotonic() >= paused_at + self.retry_s or tag != left_on  # a changed tag: it restarted

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        for replica in self.replicas:
            replica.syncer.close()


def _describe(failed: dict[str, str], *, single: bool) -> str:
    """The failures, one per replica (with one server: its error alone, as before pools)."""
    if single and len(failed) == 1:
        return next(iter(failed.values()))
    return "; ".join(f"{name}: {error}" for name, error in failed.items())
