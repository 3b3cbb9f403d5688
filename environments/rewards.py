"""Reward composition, in one place: what an episode's layers are worth.

Verifiers, judges and reward models return layers and flags, never a reward. The reward is derived here,
once, from all of an episode's layers and flags, by whatever stores it (the episode runner, pairwise group
judging, a regrade, the OpenEnv server) — so a stored episode's reward is always `total` of its stored
layers and flags. The trainer (z-score mixing, zero-variance groups) and the API (degenerate groups) use
the same rules:

    reward = total(layers, flags, spec)        # .value, .breakdown (each layer's weight × score, the flags'
                                               # cost), .solved
    has_variance(scores)                       # else the group teaches nothing

The rules:
- **Weights.** `verifier.weights` when the spec names any: a layer it does not name counts 0 (recorded,
  not rewarded). A spec that names none gets the kind's defaults (`default_weights` of the kind: the
  hidden tests for code_repo, the page for browser, the answer for read_number, the judge and the
  reward model for chat). Learned layers (the judge's, the reward model's) follow the same rule.
- **Flags** (what a hack monitor saw) cost what `verifier.flag_policy` says, once per episode: `zero`
  sets the reward to 0 and no learned layer counts (none is asked); `penalize` subtracts `flag_penalty`
  once, however many flags the episode has; `record` costs nothing.
- **Zero variance**: values whose spread (max − min) is no more than ZERO_VARIANCE_SPREAD are equal
  (`has_variance`): a group whose scores are has no learning signal, and the trainer's std scaling and
  z-scores (trainer.advantages) treat such values as constant instead of dividing by their noise.
- **Solved**: an episode whose reward is at least SOLVED_AT (full reward, up to rounding) solved its
  task: the trainer's success fraction, evaluations' pass@k (`crucible eval`) and the recipes' held-out
  success count it so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from environments.registry import get_kind
from environments.spec import EnvironmentSpec, VerifierConfig

if TYPE_CHECKING:  # a type only: the trainer imports this module without the sandbox layer
    from environments.base import LayerResult

SOLVED_AT = 1.0 - 1e-9
"""The reward at and above which an episode solved its task (full reward; the slack absorbs float sums)."""
ZERO_VARIANCE_SPREAD = 1e-4
"""Scores (or layer values) whose max − min is at most this are equal: no variance, no advantage. Rewards
are of order 1: float32 arithmetic on them (a reward model's score from one batch to the next) differs by
~1e-6, and at 1e-6 a group [0.5, 0.500002] passed and std scaling made that noise advantages of ±0.5.
1e-4 is 100× above that noise and below every deliberate reward step (the finest: DAPO's overlong
shaping, 1/overlong_buffer_tokens, 3.9e-3 at the default 256)."""

FlagPolicyName = Literal["zero", "penalize", "record"]


def layer_weights(verifier: VerifierConfig, *, defaults: Mapping[str, float]) -> dict[str, float]:
    """Each layer's weight: the spec's `verifier.weights` if it names any, else the kind's defaults."""
    return dict(verifier.weights) if verifier.weights else dict(defaults)


def spec_weights(spec: EnvironmentSpec) -> dict[str, float]:
    """layer_weights with the defaults of the spec's kind (the runner and group judging weigh learned layers)."""
    return layer_weights(spec.verifier, defaults=get_kind(spec.kind).default_weights)


def verifier_of(spec: Mapping[str, Any] | None) -> VerifierConfig:
    """The verifier section of a stored environment spec (all the trainer reads of it)."""
    return VerifierConfig.model_validate((spec or {}).get("verifier") or {})


def zscore_alphas(verifier: VerifierConfig) -> dict[str, float] | None:
    """α per layer when the spec mixes its layers by z-score (`verifier.mix: zscore`: the trainer
    rebuilds each score as Σ α × z(layer)); None: the episode's reward is the score."""
    return {name: float(alpha) for name, alpha in verifier.weights.items() if alpha} if verifier.mix == "zscore" else None


def weighted_sum(layers: Iterable[LayerResult], weights: Mapping[str, float]) -> float:
    """Σ weight × layer score; a layer without a weight counts 0."""
    return sum(weights.get(layer.name, 0.0) * layer.score for layer in layers)


@dataclass(frozen=True)
class Reward:
    """An episode's reward, derived from its layers and flags (`total`)."""

    value: float
    breakdown: dict[str, float] = field(default_factory=dict)
    """What each weighted layer added (weight × score) and, under `flags`, what the flags took (≤ 0)."""

    @property
    def solved(self) -> bool:
        return self.value >= SOLVED_AT


def total(layers: Iterable[LayerResult] | Mapping[str, float], flags: Sequence[str], spec: EnvironmentSpec) -> Reward:
    """The reward of an episode with these layers (LayerResults, or stored components: name → score) and
    flags under `spec`: Σ weight × score over the layers (environments.rewards.spec_weights), then the flags'
    cost (FlagPolicy): 0 under `zero`, minus the penalty once under `penalize`."""
    scores = dict(layers) if isinstance(layers, Mapping) else {layer.name: layer.score for layer in layers}
    weights = spec_weights(spec)
    breakdown = {name: weights[name] * score for name, score in scores.items() if weights.get(name)}
    earned = sum(breakdown.values())
    policy = FlagPolicy.of(spec.verifier)
    if policy.zeroes(flags):
        return Reward(0.0, {**breakdown, "flags": -earned})
    penalty = policy.penalty_for(flags)
    return Reward(earned - penalty, {**breakdown, "flags": -penalty} if penalty else breakdown)


@dataclass(frozen=True)
class FlagPolicy:
    """What a hack-monitor flag costs an episode (`verifier.flag_policy`, `verifier.flag_penalty`)."""

    name: FlagPolicyName = "zero"
    penalty: float = 1.0

    @classmethod
    def of(cls, verifier: VerifierConfig) -> FlagPolicy:
        return cls(verifier.flag_policy, verifier.flag_penalty)

    def zeroes(self, flags: Sequence[str]) -> bool:
        """The episode earns nothing on any layer (its learned layers are not even asked)."""
        return bool(flags) and self.name == "zero"

    def penalty_for(self, flags: Sequence[str]) -> float:
        """What the flags subtract from a reward rebuilt from the layers (0 unless `penalize`)."""
        return self.penalty if flags and self.name == "penalize" else 0.0


def has_variance(scores: Sequence[float]) -> bool:
    """False for fewer than two scores or scores that all agree within ZERO_VARIANCE_SPREAD."""
    return len(scores) >= 2 and max(scores) - min(scores) > ZERO_VARIANCE_SPREAD
