"""Which claimed groups a step trains on, which it drops (and why), and which tokens carry loss weight.

Per group, in claim order (oldest dispatched first, `trainer.store.claim_complete_groups`):
1. samples that ended by an infrastructure fault (status `failed`) or were cancelled are left out
   (`failed`), as are those refused at load (`malformed`: trainer.rollouts.load_groups) and those with a
   token sampled by a version newer than the one being trained (`foreign_version`: a negative lag, another
   run's weights under a bare label; core/versions.py) — none of them enters the group's baseline;
2. the staleness mask, per token (slime's rule for the off-policy part of a partial rollout, not a
   sample drop): a sampled token whose version lags the version being trained by more than
   `max_token_staleness` stays in the context with no loss weight; the rest of the sample trains
   with its advantage. A sample is left out for staleness only past the hard cap: a token more than
   `stale_cap_lag` behind (`stale_cap`, counted). A sample whose every token lost its loss weight stays:
   the group's scores, variance and advantages are statistics of rewards over every trainable sample,
   whatever its token lags; the mask acts on the loss only (slime's rule);
3. the rest are scored; a group whose kept samples all score the same carries no learning signal and is
   dropped (DAPO dynamic sampling); one left with a single sample of several is `stale_cap` when a
   sample went past the cap, else `too_few_samples` (the others failed);
4. the first `batch_size` surviving groups form the batch; later ones stay `complete` for the next step.
A hack canary's group (core/canaries.py) is never trained on: it is measured (`canaries`) and dropped
with the reason `canary`. Every dropped group's reason is a core.termination.DropReason.

Pacing (`may_step`): the trainer does not take a step that would leave a group it does not train on
(still running, or completed after the claim) more than `stale_cap_lag` versions behind its dispatch
version: it waits for that group (at most `lag_wait_s`, then steps anyway and the cap applies).
Oldest-dispatched-first consumption then trains the group at once, so no token lags more than the cap:
a slow task is never dropped for staleness (the head of a very slow one loses its loss weight), and
the trainer waits only on a task slower than 4η steps. On the long-tail bench (bench/episodes.py
--part tail) pacing at the token bound instead (nothing ever masked) gave 2.73× (5 pairs), no pacing
3.40× (one pair) but a sample past the cap.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from core.schemas.run import token_staleness_bound
from core.termination import DropReason, EpisodeStatus
from environments.rewards import has_variance
from trainer.advantages import shaped_reward
from trainer.config import LossConfig
from trainer.rollouts import Group, Sample

log = logging.getLogger(__name__)
MALFORMED, FOREIGN_VERSION = "malformed", "foreign_version"
"""`left_out` reasons of single samples (beside `failed` and `stale_cap`)."""


@dataclass(frozen=True)
class StalenessRule:
    """The token-level staleness mask and the hard cap (both in versions behind the trained one)."""

    max_token_staleness: int
    """A sampled token lagging more than this has no loss weight (the run's setting, default 2η)."""
    stale_cap_lag: int
    """A sample with a token lagging more than this is left out (default 4η); the trainer paces itself
    so that this does not happen (`may_step`)."""

    @classmethod
    def for_bound(cls, max_staleness: int, *, max_token_staleness: int | None = None) -> StalenessRule:
        token = token_staleness_bound(max_staleness, max_token_staleness)
        return cls(max_token_staleness=token, stale_cap_lag=max(4 * max_staleness, token))


def may_step(*, version: int, oldest_waiting: int | None, rule: StalenessRule) -> bool:
    """Whether the trainer at `version` may produce version + 1 while the oldest group it leaves behind
    (running, or complete after the claim: trainer.store.oldest_waiting_version) was dispatched at
    `oldest_waiting` (None: there is none): only if that group, consumed at the next step, stays within
    the hard cap."""
    return oldest_waiting is None or version + 1 - oldest_waiting <= rule.stale_cap_lag


@dataclass
class Pacer:
    """When a step may go ahead (may_step), and how long it waits for a group that would fall past the
    hard cap: `lag_wait_s` at most, and once per group — after giving up on a group dispatched at version
    v, later steps do not wait for groups dispatched at v or before (they would wait again at every step
    while one group hangs, and the run would crawl at one step per `lag_wait_s`)."""

    rule: StalenessRule
    lag_wait_s: float
    waiting_since: float | None = None
    gave_up_through: int | None = None
    """The newest dispatch version given up on: a group dispatched at it or before is not waited for."""

    def go(self, *, version: int, oldest_waiting: int | None, now: float) -> bool:
        if oldest_waiting is not None and self.gave_up_through is not None and oldest_waiting <= self.gave_up_through:
            oldest_waiting = None  # waited for once already
        if may_step(version=version, oldest_waiting=oldest_waiting, rule=self.rule):
            self.waiting_since = None
            return True
        if self.waiting_since is None:
            self.waiting_since = now
        if now - self.waiting_since < self.lag_wait_s:
            return False
        self.waiting_since, self.gave_up_through = None, oldest_waiting
        return True


@dataclass
class BatchPlan:
    groups: list[Group] = field(default_factory=list)
    """To train on, each holding only its kept samples."""
    dropped: dict[int, str] = field(default_factory=dict)
    """Group id → why (a core.termination.DropReason)."""
    left_out: Counter[str] = field(default_factory=Counter)
    """Samples not trained on in kept groups and dropped ones alike, by reason: failed, malformed,
    foreign_version, stale_cap."""
    staleness: list[int] = field(default_factory=list)
    """Version lag of every kept sample's oldest token."""
    token_lags: Counter[int] = field(default_factory=Counter)
    """Kept samples' sampled tokens by version lag (masked ones included)."""
    masked_tokens: int = 0
    """Kept samples' sampled tokens the staleness mask took the loss weight from."""
    scored: list[Sample] = field(default_factory=list)
    """Every scored sample of the groups examined, trained on or in a zero-variance group: the
    reward metrics describe these (leaving solved groups out would bias them)."""
    examined: int = 0
    """Groups looked at (trained on or dropped)."""
    canaries: list[Sample] = field(default_factory=list)
    """The samples of the canary groups examined (their verification scores are the canary metrics)."""

    @property
    def samples(self) -> list[Sample]:
        return [sample for group in self.groups for sample in group.samples]

    @property
    def sampled_tokens(self) -> int:
        return sum(self.token_lags.values())

    @property
    def max_weighted_lag(self) -> int | None:
        """The largest version lag of a token that carries loss weight (≤ max_token_staleness)."""
        lags = [lag for sample in self.samples for lag, weight in _lags_and_weights(sample) if weight]
        return max(lags) if lags else None


def _lags_and_weights(sample: Sample) -> list[tuple[int, int]]:
    weights = [w for w, m in zip(sample.trained_mask, sample.loss_mask, strict=True) if m]
    return list(zip(sample.lags, weights, strict=True))


def apply_staleness_mask(sample: Sample, *, current_version: int, rule: StalenessRule) -> tuple[list[int], int]:
    """Set the sample's loss weights (its sampled tokens lagging more than the rule allows lose theirs);
    returns each sampled token's lag and how many were masked."""
    lags = [current_version - version for version in sample.sampled_versions()]
    keep = iter([lag <= rule.max_token_staleness for lag in lags])
    weights = [int(next(keep)) if m else 0 for m in sample.loss_mask]
    masked = len(lags) - sum(weights)
    sample.loss_weights, sample.lags = (weights if masked else None), lags
    return lags, masked


def past_cap(lags: list[int], rule: StalenessRule) -> bool:
    """Past the hard cap: a token more than `stale_cap_lag` behind. A sample whose every token lost its loss
    weight is not past it: it gives no gradient but stays in its group's baseline (a baseline is a
    statistic of rewards, not of tokens: a slow sibling must not take the fast ones out of it)."""
    return bool(lags) and max(lags) > rule.stale_cap_lag


def plan_batch(
    groups: list[Group], *, current_version: int, rule: StalenessRule, batch_size: int, loss: LossConfig
) -> BatchPlan:
    plan = BatchPlan()
    for group in groups:
        if len(plan.groups) >= batch_size:
            break
        plan.examined += 1
        if group.canary:
            plan.canaries += group.samples
            plan.dropped[group.id] = DropReason.CANARY
            continue
        kept, lags_of, stale = [], {}, 0
        if group.malformed:
            plan.left_out[MALFORMED] += len(group.malformed)
        for sample in group.samples:
            if not sample.trainable:
                plan.left_out["failed"] += 1
                continue
            lags, masked = apply_staleness_mask(sample, current_version=current_version, rule=rule)
            if lags and min(lags) < 0:
                log.warning("episode %d: a token sampled by version %d, ahead of the trained %d (another run's "
                            "weights?); left out (foreign_version)", sample.episode_id,
                            current_version - min(lags), current_version)
                plan.left_out[FOREIGN_VERSION] += 1
                continue
            if past_cap(lags, rule):
                plan.left_out[DropReason.STALE_CAP] += 1
                stale += 1
                continue
            sample.score = shaped_reward(sample, loss=loss)
            kept.append(sample)
            lags_of[sample.episode_id] = (lags, masked)
        if not kept:
            plan.dropped[group.id] = _empty_reason(group, stale=stale)
            continue
        if len(kept) < 2 <= len(group.samples) + len(group.malformed):  # nothing to compare the one left with
            plan.scored += kept
            plan.dropped[group.id] = DropReason.STALE_CAP if stale else DropReason.TOO_FEW_SAMPLES
            continue
        plan.scored += kept
        mixed_varies = group.mix is not None and any(
            has_variance([sample.components.get(layer, 0.0) for sample in kept]) for layer in group.mix)
        if not has_variance([sample.score for sample in kept]) and not mixed_varies:
            plan.dropped[group.id] = DropReason.ZERO_VARIANCE
            continue
        group.samples = kept
        for sample in kept:
            lags, masked = lags_of[sample.episode_id]
            plan.token_lags.update(lags)
            plan.masked_tokens += masked
            plan.staleness.append(max(lags, default=current_version - sample.policy_version))
        plan.groups.append(group)
    return plan


def _empty_reason(group: Group, *, stale: int) -> DropReason:
    """Why a group kept no sample: staleness (`stale` of its samples were past the cap), every sample an
    infrastructure fault, or none of the run's own the agent ended (cancelled, nothing sampled, malformed,
    foreign)."""
    if stale:
        return DropReason.STALE_CAP
    if group.samples and all(sample.status == EpisodeStatus.FAILED for sample in group.samples):
        return DropReason.FAILED
    return DropReason.NO_TRAINABLE_SAMPLE
