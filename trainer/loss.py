"""The token-level policy objective (decoupled PPO with a truncated importance weight), as one pure function.

Per sampled token t of a sample with advantage A (environment tokens are masked out):

    w_t = min(π_prox / π_behav, C)                 behaviour → proximal correction (TIS), no gradient
    u_t = π_θ / π_prox                             the PPO ratio against the proximal policy
    P_t = min(u_t A, clip(u_t, 1 − ε_low, 1 + ε_high) A), and for A < 0 max(P_t, c·A)   (dual clip)
    J_t = w_t · P_t − β · k3_t
    k3_t = min(e^d − d − 1, 10), d = log π_ref − log π_θ   capped as verl caps it
    L   = − Σ_t J_t / N_active                     DAPO: token sum ÷ active tokens of the whole batch

π_behav is vLLM's logprob at sampling time (the stored turn logprobs), π_prox is recomputed by the
trainer at the start of the step (AReaL's decoupled loss), C = 2 (TIS), c = 3 (`dual_clip`, verl's).
Computed in log space.

The KL term's direction: on tokens drawn from π_θ, k3's value estimates KL(π_θ ‖ π_ref), the reverse KL,
but differentiated as a loss (the sampling distribution is not differentiated) its expected gradient is
E[(1 − π_ref/π_θ) ∇log π_θ] = ∇ KL(π_ref ‖ π_θ): it pulls toward the forward KL (Tang & Munos 2025).
Stale tokens were drawn from π_behav, not π_θ, and the term is not reweighted by w for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainer.config import LossConfig

# Summed over a step's micro-batches, then turned into means by `trainer.metrics`.
STAT_KEYS = (
    "tokens", "clip_low", "clip_high", "clip_dual", "tis_capped", "iw_sum", "iw_sq_sum", "mismatch_k3",
    "mismatch_abs", "fresh_tokens", "fresh_mismatch_k3", "ppo_kl", "entropy", "entropy_tokens", "kl_ref",
)


@dataclass(frozen=True)
class TokenTensors:
    """One micro-batch's per-token inputs, all (B, T−1): position t scores token t+1."""

    logp: torch.Tensor  # π_θ, with gradient
    prox_logp: torch.Tensor  # π_prox, no gradient
    behav_logp: torch.Tensor  # π_behav (vLLM)
    advantages: torch.Tensor  # the sample's advantage on each of its tokens
    mask: torch.Tensor  # 1.0 where the policy sampled the token
    entropy: torch.Tensor | None = None  # H(π_θ) per position, no gradient
    ref_logp: torch.Tensor | None = None  # π_ref, when a KL term is on
    fresh: torch.Tensor | None = None  # 1.0 where the token's version lag is 0 (the mismatch apart from staleness)


K3_MAX = 10.0
"""The k3 value cap (verl's): e^d − d − 1 grows as e^d, and one token far from π_ref (d = 20: 4.9e8)
would swamp the batch's loss and gradient; past the cap the token adds a constant, no gradient."""


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(p‖q) from d = log q − log p, x drawn from p: e^d − d − 1 ≥ 0, its
    value capped at K3_MAX (d is clamped to ±20 first, so that e^d stays finite)."""
    d = log_ratio.clamp(-20.0, 20.0)
    return (torch.expm1(d) - d).clamp(max=K3_MAX)


def policy_loss(
    tokens: TokenTensors, *, total_tokens: int, loss: LossConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The micro-batch's share of the step loss (already divided by the batch's active tokens) and
    its summed statistics (see STAT_KEYS)."""
    mask = tokens.mask
    log_w = (tokens.prox_logp - tokens.behav_logp).detach()  # (B, T-1)
    weight = torch.exp(torch.clamp(log_w, max=math.log(loss.tis_cap)))
    ratio = torch.exp(tokens.logp - tokens.prox_logp.detach())  # (B, T-1) u
    advantages = tokens.advantages
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - loss.clip_low, 1.0 + loss.clip_high) * advantages
    surrogate = torch.minimum(unclipped, clipped)  # (B, T-1)
    dual = torch.zeros_like(surrogate, dtype=torch.bool)
    if loss.dual_clip is not None:  # for A < 0, at least c·A: a token far above π_prox costs c·|A|, no gradient
        bound = loss.dual_clip * advantages
        dual = (advantages < 0) & (surrogate < bound)
        surrogate = torch.where(dual, bound, surrogate)
    objective = weight * surrogate
    per_token = -objective
    kl_ref = torch.zeros_like(per_token)
    if loss.kl_beta > 0.0 and tokens.ref_logp is not None:
        # d = log π_ref − log π_θ: the value estimates KL(π_θ ‖ π_ref), the gradient is KL(π_ref ‖ π_θ)'s
        kl_ref = k3(tokens.ref_logp.detach() - tokens.logp)
        per_token = per_token + loss.kl_beta * kl_ref
    value = (per_token * mask).sum() / max(total_tokens, 1)
    with torch.no_grad():
        stats = _stats(tokens, ratio=ratio, weight=weight, log_w=log_w, kl_ref=kl_ref, dual=dual, loss=loss)
    return value, stats


def _stats(
    tokens: TokenTensors, *, ratio: torch.Tensor, weight: torch.Tensor, log_w: torch.Tensor, kl_ref: torch.Tensor,
    dual: torch.Tensor, loss: LossConfig,
) -> dict[str, float]:
    mask = tokens.mask.bool()
    adv = tokens.advantages
    fresh = mask & tokens.fresh.bool() if tokens.fresh is not None else torch.zeros_like(mask)

    def total(values: torch.Tensor, where: torch.Tensor = mask) -> float:
        return float(values[where].double().sum())

    mismatch = k3(log_w)  # (B, T-1) KL(π_behav ‖ π_prox) sampled under vLLM: the trainer's numbers against vLLM's
    stats = {
        "tokens": float(mask.sum()),
        # The clip binds (no gradient through the token) below 1−ε_low for A<0, above 1+ε_high for A>0.
        "clip_low": total(((ratio < 1.0 - loss.clip_low) & (adv < 0)).double()),
        "clip_high": total(((ratio > 1.0 + loss.clip_high) & (adv > 0)).double()),
        "clip_dual": total(dual.double()),
        "tis_capped": total((log_w > math.log(loss.tis_cap)).double()),
        "iw_sum": total(weight),
        "iw_sq_sum": total(weight * weight),
        # Over every weighted token, lags up to max_token_staleness: numerical mismatch and policy drift.
        "mismatch_k3": total(mismatch),
        "mismatch_abs": total(log_w.abs()),
        # Over lag-0 tokens alone (sampled by the weights being trained): the numerical mismatch by itself.
        "fresh_tokens": float(fresh.sum()),
        "fresh_mismatch_k3": total(mismatch, fresh),
        "ppo_kl": total((tokens.prox_logp - tokens.logp).detach()),
        "entropy": total(tokens.entropy) if tokens.entropy is not None else 0.0,
        "entropy_tokens": float(mask.sum()) if tokens.entropy is not None else 0.0,
        "kl_ref": total(kl_ref.detach()),
    }
    if mask.any():
        stats["iw_max"], stats["iw_min"] = float(weight[mask].max()), float(weight[mask].min())
    return stats


def merge_stats(into: dict[str, float], more: dict[str, float]) -> None:
    """Sum the additive stats; keep the extremes of the max/min ones."""
    for key, value in more.items():
        if key.endswith("_max"):
            into[key] = max(into.get(key, value), value)
        elif key.endswith("_min"):
            into[key] = min(into.get(key, value), value)
        else:
            into[key] = into.get(key, 0.0) + value
