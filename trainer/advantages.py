"""Rewards → scores → group-relative advantages.

    shaped = shaped_reward(sample, loss=cfg)             # reward + DAPO overlong penalty
    mix_layers(groups)                                   # spec `mix: zscore`: Σ α × z(layer), scales aligned
    normalize_per_environment(groups, mode="on")         # z-score per environment (the run's mode)
    assign_advantages(groups, scale_by_std=False)        # A_i = s_i − mean(s) [ / std(s) ]

One advantage per episode, broadcast to every token it sampled (uniform credit over its turns).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from environments.rewards import has_variance
from trainer.config import LossConfig
from trainer.rollouts import Group, Sample


def overlong_penalty(sampled_tokens: int, *, max_tokens: int, buffer_tokens: int) -> float:
    """DAPO's soft overlong punishment: 0 up to max − buffer, then linear to −1 at max, −1 beyond."""
    start = max_tokens - buffer_tokens
    if sampled_tokens <= start:
        return 0.0
    if sampled_tokens <= max_tokens:
        return (start - sampled_tokens) / buffer_tokens
    return -1.0


def shaped_reward(sample: Sample, *, loss: LossConfig) -> float:
    """The verifier's reward plus, when configured, the overlong penalty on the episode's sampled
    tokens (all turns together: the agent's whole output is what grows too long)."""
    if loss.overlong_max_tokens is None:
        return sample.reward
    return sample.reward + overlong_penalty(
        sample.sampled_tokens, max_tokens=loss.overlong_max_tokens, buffer_tokens=loss.overlong_buffer_tokens
    )


def _layer_value(sample: Sample, layer: str, group: Group) -> float:
    """The layer's score as the mix counts it: a flagged sample under `flag_policy: zero` earned nothing
    on any layer (its reward is 0, whatever a layer that still ran reported)."""
    if group.flag_policy.zeroes(sample.flags):
        return 0.0
    return sample.components.get(layer, 0.0)


def mix_layers(groups: list[Group]) -> dict[str, dict[str, tuple[float, float]]]:
    """For groups whose environment mixes by z-score (Group.mix: α per layer), replace each sample's
    score by Σ α·(c − mean_c)/std_c over the layers, the mean and std of each layer taken within the
    environment across the batch (a layer constant there contributes 0), plus what shaping added to the
    reward (the overlong penalty), minus the flag penalty for a flagged sample under `flag_policy:
    penalize` (the rebuilt score would otherwise lose it: a flagged and an honest sample with equal
    layers would get the same advantage); each layer's α·z is kept in `sample.mixed` (the step's
    metrics show its distribution). Returns each mixed environment's (mean, std) per layer."""
    by_env: dict[str, list[tuple[Sample, Group]]] = defaultdict(list)
    for group in groups:
        if group.mix:
            by_env[group.environment] += [(sample, group) for sample in group.samples]
    stats: dict[str, dict[str, tuple[float, float]]] = {}
    for env, members in by_env.items():
        alphas = members[0][1].mix or {}
        layer_stats, varies = {}, {}
        for layer in alphas:
            values = [_layer_value(sample, layer, group) for sample, group in members]
            layer_stats[layer] = (statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0)
            varies[layer] = has_variance(values)  # a constant layer (noise apart) contributes 0
        stats[env] = layer_stats
        for sample, group in members:
            shaping = sample.score - sample.reward
            sample.mixed = {
                layer: alpha * ((_layer_value(sample, layer, group) - mean) / std if varies[layer] else 0.0)
                for layer, alpha in alphas.items() for mean, std in [layer_stats[layer]]}
            sample.score = shaping + sum(sample.mixed.values()) - group.flag_policy.penalty_for(sample.flags)
    return stats


def normalize_per_environment(groups: list[Group], *, mode: str) -> dict[str, tuple[float, float]]:
    """z-score every sample's score within its environment across the batch, so an environment with
    large or shifted rewards does not dominate the gradient. `mode`: on or off, decided once for the
    run (LossConfig.normalization_for), never by what one batch holds. Returns each environment's
    (mean, std) before normalising."""
    if mode not in ("on", "off"):
        raise ValueError(f"normalization mode: expected 'on' or 'off' (resolved per run), got {mode!r}")
    by_env: dict[str, list[Sample]] = defaultdict(list)
    for group in groups:
        for sample in group.samples:
            by_env[sample.environment].append(sample)
    if mode == "off":
        return {}
    stats = {}
    for env, samples in by_env.items():
        scores = [sample.score for sample in samples]
        mean = statistics.fmean(scores)
        std = statistics.pstdev(scores) if len(scores) > 1 else 0.0
        stats[env] = (mean, std)
        varies = has_variance(scores)
        for sample in samples:
            sample.score = (sample.score - mean) / std if varies else 0.0
    return stats


def assign_advantages(groups: list[Group], *, scale_by_std: bool) -> None:
    """A_i = s_i − mean_group(s); divided by the group's std when `scale_by_std` (GRPO), not (Dr. GRPO).
    Scores that agree within ZERO_VARIANCE_SPREAD (environments.rewards.has_variance) all get 0: their
    differences are noise, which dividing by their std would blow up to ±1. (A spread above it bounds the
    std away from 0: at least spread / √(2n) for n scores.)"""
    for group in groups:
        scores = [sample.score for sample in group.samples]
        mean = statistics.fmean(scores)
        std = statistics.pstdev(scores)
        varies = has_variance(scores)
        for sample in group.samples:
            advantage = sample.score - mean if varies else 0.0
            sample.advantage = advantage / std if scale_by_std and varies else advantage
            if not math.isfinite(sample.advantage):
                raise ValueError(f"episode {sample.episode_id}: non-finite advantage from scores {scores}")
