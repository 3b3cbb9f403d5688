"""Which claimed groups a step trains on, and which it drops (and why).

Per group, in claim order (oldest first):
1. samples that ended by an infrastructure fault (status `failed`) or were cancelled are left out;
2. samples older than the staleness bound (run version − sample version > max_staleness) are left out;
3. the rest are scored; a group whose kept samples all score the same (or keep fewer than two)
   carries no learning signal and is dropped (DAPO dynamic sampling);
4. the first `batch_size` surviving groups form the batch; later ones stay `complete` for the next step.
A hack canary's group (core/canaries.py) is never trained on: it is measured (`canaries`) and dropped
with the reason `canary`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from trainer.advantages import has_variance, shaped_reward
from trainer.config import LossConfig
from trainer.rollouts import Group, Sample


@dataclass
class BatchPlan:
    groups: list[Group] = field(default_factory=list)
    """To train on, each holding only its kept samples."""
    dropped: dict[int, str] = field(default_factory=dict)
    """Group id → why: zero_variance, stale or no_trainable_sample."""
    left_out: Counter[str] = field(default_factory=Counter)
    """Samples not trained on in kept groups and dropped ones alike, by reason: failed, stale."""
    staleness: list[int] = field(default_factory=list)
    """Version lag of every kept sample."""
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


def plan_batch(
    groups: list[Group], *, current_version: int, max_staleness: int, batch_size: int, loss: LossConfig
) -> BatchPlan:
    plan = BatchPlan()
    for group in groups:
        if len(plan.groups) >= batch_size:
            break
        plan.examined += 1
        if group.canary:
            plan.canaries += group.samples
            plan.dropped[group.id] = "canary"
            continue
        kept = []
        for sample in group.samples:
            if not sample.trainable:
                plan.left_out["failed"] += 1
            elif current_version - sample.policy_version > max_staleness:
                plan.left_out["stale"] += 1
            else:
                sample.score = shaped_reward(sample, loss=loss)
                kept.append(sample)
        if not kept:
            stale = any(s.trainable for s in group.samples)
            plan.dropped[group.id] = "stale" if stale else "no_trainable_sample"
            continue
        plan.scored += kept
        mixed_varies = group.mix is not None and any(
            has_variance([sample.components.get(layer, 0.0) for sample in kept]) for layer in group.mix)
        if not has_variance([sample.score for sample in kept]) and not mixed_varies:
            plan.dropped[group.id] = "zero_variance"
            continue
        group.samples = kept
        plan.staleness += [current_version - sample.policy_version for sample in kept]
        plan.groups.append(group)
    return plan
