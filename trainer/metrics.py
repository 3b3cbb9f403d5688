"""Every metric the trainer writes to `training_steps.metrics`, named `area/metric[/stat]`, in one place.
Renaming one is a breaking change (dashboards and the demo read them).

Fixed names are constants below; the templated families are:
    reward/{env}/mean, reward/{env}/std, reward/{env}/{component}/mean|std, rollout/flagged/{flag}
    score/{env}/mean|std (the trained samples' scores after mixing and per-environment normalisation)
    score/{env}/{layer}/mean|std (under `mix: zscore`: each layer's α·z, its share of the score)
    advantage/{env}/mean|std|abs_mean (what each environment contributes to the gradient)
    batch/dropped/{reason}, batch/left_out/{reason}, rollout/termination/{reason}
    policy/staleness/hist/{lag} (kept samples by their oldest token's lag), policy/token_lag/hist/{lag}
    (kept samples' sampled tokens by lag), timing_s/{stage}, reward_hacking/judge_agreement/{component}
Hack canaries (core/canaries.py), in a step that examined any: canary/episodes, canary/reward_mean (their
mean score on the layer no honest change passes), canary/rewarded (how many scored above 0).
The step's cost (cost/…: time and tokens per stage, FLOPs, FLOP/s, MFU) is named in `trainer.cost`.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter, defaultdict

from core.canaries import canary_score
from core.termination import DropReason
from environments.rewards import SOLVED_AT
from trainer.rollouts import Sample
from trainer.selection import BatchPlan
from trainer.step import UpdateResult

LOSS = "loss/policy"
GRAD_NORM = "optim/grad_norm"
LR = "optim/lr"
ENTROPY = "policy/entropy"
CLIP_LOW = "policy/clip_frac/low"
CLIP_HIGH = "policy/clip_frac/high"
CLIP_DUAL = "policy/clip_frac/dual"
"""Fraction of tokens (A < 0) whose objective the dual clip bounded at c·A (LossConfig.dual_clip)."""
PPO_KL = "policy/ppo_kl"
CANARY_EPISODES = "canary/episodes"
CANARY_REWARD_MEAN = "canary/reward_mean"
CANARY_REWARDED = "canary/rewarded"
KL_REF = "policy/kl_ref"
IW_MEAN, IW_STD = "policy/importance_weight/mean", "policy/importance_weight/std"
IW_MAX, IW_MIN = "policy/importance_weight/max", "policy/importance_weight/min"
IW_CAPPED = "policy/importance_weight/capped_frac"
MISMATCH_KL = "mismatch/kl"
"""k3 estimate of KL(π_vLLM ‖ π_trainer) over the batch's weighted tokens (behaviour vs recomputed): stale
tokens included, so it mixes the numerical mismatch with policy drift."""
MISMATCH_KL_LAG0 = "mismatch/kl_lag0"
"""The same over lag-0 tokens only (sampled by the weights being trained): the numerical mismatch alone
(bf16, kernels). Absent from a step without such a token."""
MISMATCH_ABS = "mismatch/abs_diff"
REWARD_MEAN, REWARD_STD = "reward/mean", "reward/std"
SUCCESS = "reward/success_frac"
"""Fraction of scored samples with reward ≥ 1 (full marks)."""
ZERO_VARIANCE = "batch/zero_variance_frac"
GROUPS, SAMPLES = "batch/groups", "batch/samples"
TOKENS, SAMPLED_TOKENS = "batch/tokens", "batch/sampled_tokens"
ADV_MEAN, ADV_STD = "batch/advantage/mean", "batch/advantage/std"
STALENESS_MEAN, STALENESS_MAX = "policy/staleness/mean", "policy/staleness/max"
TOKEN_MASKED = "policy/token_lag/masked_frac"
"""Fraction of the kept samples' sampled tokens the staleness mask took the loss weight from."""
TOKEN_LAG_MAX_WEIGHTED = "policy/token_lag/max_weighted"
"""The largest lag of a token that carried loss weight: never above the run's max_token_staleness."""
TOKEN_LAG_MEAN = "policy/token_lag/mean"
TURNS_MEAN = "rollout/turns/mean"
PREFIX_BREAKS_MEAN = "rollout/prefix_breaks/mean"
"""Per scored episode, turns whose prompt was not the previous turn's extended (task_workers/episode/loop.py):
above 0, what is trained on is not what was sampled."""
UNPARSED_TOOL_CALLS_MEAN = "rollout/unparsed_tool_calls/mean"
"""Per scored episode, turns whose tool call did not parse."""
NO_TOOL_CALL_MEAN = "rollout/turns_without_tool_call/mean"
"""Per scored episode, turns without a tool call."""
FLAGGED = "rollout/flagged_frac"
"""Fraction of the step's scored episodes the hack monitors flagged (rollout/flagged/{flag}: by flag)."""
TRUNCATED = "rollout/truncated_frac"
TOKENS_PER_S = "throughput/tokens_per_s"
SKIPPED_STEPS = "optim/skipped_steps"
"""Steps skipped since the previous recorded one because a loss or gradient norm was not finite."""
SYNC_SECONDS = "sync/seconds"
PROBE_KL, PROBE_DIFF = "sync/probe_kl", "sync/probe_mean_abs_diff"
STAGES = ("generate", "score", "advantages", "update", "checkpoint", "commit", "sync")
LENGTH_REWARD_CORR = "reward_hacking/length_reward_corr"
"""Pearson correlation of each scored episode's sampled tokens with its reward over the step: a learned
reward (a judge, a reward model) that pays for length shows it rising while success does not."""
LENGTH_JUDGE_CORR = "reward_hacking/length_judge_corr"
"""The same with the judge layer's score alone, over the episodes a judge scored."""
JUDGE_LAYER = "judge"  # environments.judge.LAYER (not imported: the trainer does not load environments)
FAMILIES = (
    "reward/{env}/mean", "reward/{env}/std", "reward/{env}/{component}/mean", "reward/{env}/{component}/std",
    "score/{env}/mean", "score/{env}/std", "score/{env}/{layer}/mean", "score/{env}/{layer}/std",
    "advantage/{env}/mean", "advantage/{env}/std", "advantage/{env}/abs_mean",
    "batch/dropped/{reason}", "batch/left_out/{reason}", "rollout/termination/{reason}", "rollout/flagged/{flag}",
    "policy/staleness/hist/{lag}", "policy/token_lag/hist/{lag}", "timing_s/{stage}",
    "reward_hacking/judge_agreement/{component}",
)
"""The templated names (the docstring's families); `timing_s/{stage}` takes only the STAGES."""


@functools.cache
def fixed_names() -> frozenset[str]:
    """Every metric name that is a constant here or in `trainer.cost` (not a template)."""
    from trainer import cost

    return frozenset(value for module in (globals(), vars(cost)) for key, value in module.items()
                     if key.isupper() and isinstance(value, str) and "/" in value and not value.endswith("/")
                     and " " not in value)  # a sentence (cost.PROJECTION_FORMULA) is no name


def is_metric_name(name: str) -> bool:
    """Whether the trainer writes (or may write) a metric of this name: one of `fixed_names()`, or one
    of the FAMILIES with its placeholders filled."""
    if name in fixed_names():
        return True
    if name.startswith("timing_s/"):
        return name.removeprefix("timing_s/") in STAGES
    parts = name.split("/")
    return any(len(parts) == len(family.split("/")) and all(
        f.startswith("{") or f == p for f, p in zip(family.split("/"), parts, strict=True)) and all(parts)
        for family in FAMILIES)


def reward_key(env: str, stat: str) -> str:
    return f"reward/{env}/{stat}"


def component_key(env: str, component: str) -> str:
    return f"reward/{env}/{component}/mean"


def timing_key(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"timing stage: expected one of {', '.join(STAGES)}, got {stage!r}")
    return f"timing_s/{stage}"


def _clean(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None  # JSON has no NaN


def reward_metrics(samples: list[Sample]) -> dict[str, float]:
    """Reward mean/std overall, per environment and per reward component; success fraction."""
    if not samples:
        return {}
    rewards = [s.reward for s in samples]
    out = {REWARD_MEAN: statistics.fmean(rewards), REWARD_STD: statistics.pstdev(rewards),
           SUCCESS: sum(r >= SOLVED_AT for r in rewards) / len(rewards)}
    by_env: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_env[sample.environment].append(sample)
    for env, group in by_env.items():
        values = [s.reward for s in group]
        out[reward_key(env, "mean")] = statistics.fmean(values)
        out[reward_key(env, "std")] = statistics.pstdev(values)
        components: dict[str, list[float]] = defaultdict(list)
        for sample in group:
            for name, value in sample.components.items():
                components[name].append(value)
        for name, values in components.items():
            out[component_key(env, name)] = statistics.fmean(values)
            out[f"reward/{env}/{name}/std"] = statistics.pstdev(values)  # raw: the scale `mix: zscore` aligns
    return out


def trained_metrics(samples: list[Sample]) -> dict[str, float]:
    """Per environment, the trained samples' scores after mixing and normalisation and their advantages:
    beside `reward/{env}/…` (raw) they show what normalisation did; an environment whose rewards are ten
    times larger has the same `score/{env}/std` (1 when the run normalises) and advantages no larger."""
    by_env: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_env[sample.environment].append(sample)
    out: dict[str, float] = {}
    for env, group in by_env.items():
        scores, advantages = [s.score for s in group], [s.advantage for s in group]
        out[f"score/{env}/mean"], out[f"score/{env}/std"] = statistics.fmean(scores), statistics.pstdev(scores)
        out[f"advantage/{env}/mean"] = statistics.fmean(advantages)
        out[f"advantage/{env}/std"] = statistics.pstdev(advantages)
        out[f"advantage/{env}/abs_mean"] = statistics.fmean(abs(a) for a in advantages)
        for layer in sorted({name for s in group for name in s.mixed}):  # `mix: zscore`: each layer's α·z
            shares = [s.mixed.get(layer, 0.0) for s in group]
            out[f"score/{env}/{layer}/mean"], out[f"score/{env}/{layer}/std"] = \
                statistics.fmean(shares), statistics.pstdev(shares)
    return out


def judge_agreement_key(component: str) -> str:
    return f"reward_hacking/judge_agreement/{component}"


def _pearson(xs: list[float], ys: list[float]) -> float | None:
    """None when either side is constant (no correlation to speak of) or there are fewer than 3 points."""
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def hacking_metrics(samples: list[Sample]) -> dict[str, float]:
    """Monitors for learned rewards (seed: "PPR must guard against exploitation of RM biases"): length
    against reward and against the judge's score, and how often the judge agrees with each other layer
    of the same episodes (both ≥ 0.5, or both below) — a judge drifting from the tests is a judge being
    gamed, or a rubric that says something else."""
    out: dict[str, float] = {}
    corr = _pearson([float(s.sampled_tokens) for s in samples], [s.reward for s in samples])
    if corr is not None:
        out[LENGTH_REWARD_CORR] = corr
    judged = [s for s in samples if JUDGE_LAYER in s.components]
    corr = _pearson([float(s.sampled_tokens) for s in judged], [s.components[JUDGE_LAYER] for s in judged])
    if corr is not None:
        out[LENGTH_JUDGE_CORR] = corr
    agree: dict[str, list[bool]] = defaultdict(list)
    for sample in judged:
        judge_passed = sample.components[JUDGE_LAYER] >= 0.5
        for name, value in sample.components.items():
            if name != JUDGE_LAYER:
                agree[name].append((value >= 0.5) == judge_passed)
    for name, values in agree.items():
        out[judge_agreement_key(name)] = sum(values) / len(values)
    return out


def batch_metrics(plan: BatchPlan) -> dict[str, float]:
    samples = plan.samples
    out: dict[str, float] = {GROUPS: len(plan.groups), SAMPLES: len(samples),
                             TOKENS: sum(len(s.token_ids) for s in samples),
                             SAMPLED_TOKENS: sum(s.sampled_tokens for s in samples)}
    zero = sum(1 for reason in plan.dropped.values() if reason == DropReason.ZERO_VARIANCE)
    out[ZERO_VARIANCE] = zero / plan.examined if plan.examined else 0.0
    for reason, count in Counter(plan.dropped.values()).items():
        out[f"batch/dropped/{reason}"] = count
    for reason, count in plan.left_out.items():
        out[f"batch/left_out/{reason}"] = count
    if samples:
        advantages = [s.advantage for s in samples]
        out[ADV_MEAN], out[ADV_STD] = statistics.fmean(advantages), statistics.pstdev(advantages)
        out[TRUNCATED] = sum(s.truncated for s in samples) / len(samples)
        for reason, count in Counter(str(s.termination) for s in plan.scored).items():
            out[f"rollout/termination/{reason}"] = count / len(plan.scored)
    if plan.scored:
        out[FLAGGED] = sum(bool(s.flags) for s in plan.scored) / len(plan.scored)
        for flag, count in Counter(flag for s in plan.scored for flag in s.flags).items():
            out[f"rollout/flagged/{flag}"] = count / len(plan.scored)
    measured = [canary_score(s.components) for s in plan.canaries if s.trainable]
    if measured:
        out[CANARY_EPISODES], out[CANARY_REWARD_MEAN] = len(measured), statistics.fmean(measured)
        out[CANARY_REWARDED] = sum(score > 0 for score in measured)
    if plan.staleness:
        out[STALENESS_MEAN], out[STALENESS_MAX] = statistics.fmean(plan.staleness), max(plan.staleness)
        for lag, count in Counter(plan.staleness).items():
            out[f"policy/staleness/hist/{lag}"] = count
    if plan.sampled_tokens:
        out[TOKEN_MASKED] = plan.masked_tokens / plan.sampled_tokens
        out[TOKEN_LAG_MEAN] = sum(lag * n for lag, n in plan.token_lags.items()) / plan.sampled_tokens
        for lag, count in plan.token_lags.items():
            out[f"policy/token_lag/hist/{lag}"] = count
        weighted = plan.max_weighted_lag
        if weighted is not None:
            out[TOKEN_LAG_MAX_WEIGHTED] = weighted
    return out


def update_metrics(result: UpdateResult) -> dict[str, float]:
    stats = result.stats
    tokens = stats.get("tokens", 0.0)
    if not tokens:
        return {}
    iw_mean = stats["iw_sum"] / tokens
    out = {
        LOSS: result.loss, LR: result.lr, GRAD_NORM: statistics.fmean(result.grad_norms),
        ENTROPY: stats["entropy"] / max(stats["entropy_tokens"], 1.0),
        CLIP_LOW: stats["clip_low"] / tokens, CLIP_HIGH: stats["clip_high"] / tokens,
        CLIP_DUAL: stats["clip_dual"] / tokens,
        PPO_KL: stats["ppo_kl"] / tokens, KL_REF: stats["kl_ref"] / tokens,
        IW_MEAN: iw_mean, IW_STD: math.sqrt(max(stats["iw_sq_sum"] / tokens - iw_mean**2, 0.0)),
        IW_MAX: stats.get("iw_max", 0.0), IW_MIN: stats.get("iw_min", 0.0), IW_CAPPED: stats["tis_capped"] / tokens,
        MISMATCH_KL: stats["mismatch_k3"] / tokens, MISMATCH_ABS: stats["mismatch_abs"] / tokens,
        TOKENS_PER_S: result.tokens_processed / result.seconds if result.seconds > 0 else 0.0,
    }
    if stats.get("fresh_tokens"):
        out[MISMATCH_KL_LAG0] = stats["fresh_mismatch_k3"] / stats["fresh_tokens"]
    return out


def step_metrics(
    *, plan: BatchPlan, result: UpdateResult | None, timings: dict[str, float]
) -> dict[str, float | None]:
    """Everything known when the step is recorded (sync metrics are added after the push)."""
    metrics: dict[str, float] = {**reward_metrics(plan.scored), **batch_metrics(plan), **hacking_metrics(plan.scored)}
    if result is not None:
        metrics.update(update_metrics(result))
        metrics.update(trained_metrics(plan.samples))  # scored and advantaged before the update
    if plan.scored:
        metrics[TURNS_MEAN] = statistics.fmean(s.turns for s in plan.scored)
        metrics[PREFIX_BREAKS_MEAN] = statistics.fmean(s.prefix_breaks for s in plan.scored)
        metrics[UNPARSED_TOOL_CALLS_MEAN] = statistics.fmean(s.unparsed_tool_calls for s in plan.scored)
        metrics[NO_TOOL_CALL_MEAN] = statistics.fmean(s.turns_without_tool_call for s in plan.scored)
    for stage, seconds in timings.items():
        metrics[timing_key(stage)] = seconds
    return {key: _clean(float(value)) for key, value in sorted(metrics.items())}


def sync_metrics(*, seconds: float, probe_kl: float, probe_diff: float) -> dict[str, float | None]:
    return {SYNC_SECONDS: _clean(seconds), timing_key("sync"): _clean(seconds), PROBE_KL: _clean(probe_kl),
            PROBE_DIFF: _clean(probe_diff)}
