"""One training step as four functions: generate → score → advantages → update.

    plan = generate(session, run_id=..., version=..., rule=StalenessRule.for_bound(η), batch_size=..., loss=cfg.loss)
    env_stats = score(plan, normalization="on")                # per-environment (mean, std), when the run normalizes
    advantages(plan, loss=cfg.loss)
    result = update(engine, plan.samples, config=cfg, temperature=1.0)

`generate` collects rollouts the task workers produced (claiming their groups in the caller's
transaction); the caller records the step and commits (see `trainer.loop`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from sqlalchemy.orm import Session

from trainer.advantages import assign_advantages, mix_layers, normalize_per_environment
from trainer.config import LossConfig, TrainerConfig
from trainer.engine import PolicyEngine
from trainer.errors import NonFiniteStep
from trainer.logprobs import sequence_logprobs, token_logprobs
from trainer.loss import TokenTensors, merge_stats, policy_loss
from trainer.packing import MicroBatch, micro_batches, split_minibatches
from trainer.ranks import Ranks, share
from trainer.rollouts import Sample, load_groups
from trainer.selection import BatchPlan, StalenessRule, plan_batch
from trainer.sizing import micro_batch_tokens_for, parameter_count
from trainer.store import claim_complete_groups

CLAIM_FACTOR = 4  # claim up to this many batches' worth of complete groups: room to refill after drops


def generate(
    session: Session, *, run_id: int, version: int, rule: StalenessRule, batch_size: int, loss: LossConfig
) -> BatchPlan:
    """Claim complete groups (locked until the caller's transaction ends), read their rollouts, and
    plan the batch: which groups to train on, which to drop, which tokens carry loss weight."""
    claimed = claim_complete_groups(session, run_id=run_id, limit=batch_size * CLAIM_FACTOR)
    groups = load_groups(session, claimed)
    return plan_batch(groups, current_version=version, rule=rule, batch_size=batch_size, loss=loss)


def score(plan: BatchPlan, *, normalization: str) -> dict[str, tuple[float, float]]:
    """Mix the layers of environments whose spec says `mix: zscore` (scales aligned first), then normalise
    scores per environment when the run does (`normalization`: the run's resolved mode, on or off, see
    LossConfig.normalization_for); returns each environment's (mean, std) before that normalisation."""
    mix_layers(plan.groups)
    return normalize_per_environment(plan.groups, mode=normalization)


def advantages(plan: BatchPlan, *, loss: LossConfig) -> None:
    assign_advantages(plan.groups, scale_by_std=loss.scale_advantages_by_std)


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether the model's training forward is random: a dropout module with p > 0 (LoRA's dropout),
    or attention dropout in its config."""
    config = getattr(model, "config", None)
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()) or bool(
        getattr(config, "attention_dropout", 0.0))


@dataclass
class UpdateResult:
    stats: dict[str, float] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)
    lr: float = 0.0
    loss: float = 0.0
    tokens_processed: int = 0
    """Real (unpadded) tokens through forward and backward, all epochs."""
    seconds: float = 0.0


def fresh_positions(sample: Sample) -> torch.Tensor:
    """(T−1,) 1.0 where the scored token was sampled at lag 0 (by the weights being trained), else 0: the
    tokens whose mismatch is numerical alone (`mismatch/kl_lag0`). All 0 when the sample's lags were
    never set (trainer.selection.plan_batch sets them)."""
    flags = [0.0] * len(sample.token_ids)
    if len(sample.lags) == sample.sampled_tokens:
        lags = iter(sample.lags)
        flags = [float(next(lags) == 0) if sampled else 0.0 for sampled in sample.loss_mask]
    return torch.tensor(flags[1:])  # position t scores token t+1


def _rows(values: dict[int, torch.Tensor], batch: MicroBatch) -> torch.Tensor:
    """Per-row (T−1,) tensors back into the micro-batch's (B, T−1) layout."""
    out = torch.zeros_like(batch.mask)
    for row, key in enumerate(batch.sample_ids):
        value = values[key]
        out[row, : value.shape[0]] = value
    return out


def update(
    engine: PolicyEngine, samples: list[Sample], *, config: TrainerConfig, temperature: float = 1.0,
    reference: torch.nn.Module | None = None,
) -> UpdateResult:
    """`epochs` × `minibatches` optimizer steps on `samples` (advantages assigned)."""
    started = time.perf_counter()
    opt = config.optimizer
    engine.module.train()
    # One row per sequence sampled: an agent program's episode whose calls rewrote their context is several.
    samples = [replace(row, row=number)
               for number, row in enumerate(row for sample in samples for row in sample.rows())]
    chunks = _minibatch_chunks(engine, samples, config=config)
    every = [batch for chunk in chunks for batch in chunk]
    # One pass over the batch: π_prox is π_θ at the step's start, i.e. the forward's own detached
    # logprobs; more passes need them recomputed once, before the first optimizer step. So does a model
    # with dropout on (LoRA's): its training forward is noisy, π_prox must be the weights themselves,
    # computed in eval mode.
    single_pass = opt.epochs == 1 and len(chunks) == 1 and not has_dropout(engine.module)
    model = engine.module  # its decoder and head are called apart (see trainer.logprobs) ...
    first = next(model.parameters())
    whole = engine if hasattr(first, "ds_id") else None  # ... unless ZeRO-3 partitions it
    # bf16 autocast when the run asks for it: the decoder's forward (hence its backward) of the policy, and
    # of the proximal pass, so that π_θ/π_prox is 1 at the step's start; the output layer, the log-softmax
    # and the loss stay float32 (trainer.logprobs.float32_head; not under ZeRO-3, whose forward is whole).
    autocast = torch.autocast(first.device.type, dtype=torch.bfloat16, enabled=opt.autocast == "bf16")
    prox = None if single_pass else _proximal_logprobs(model, every, autocast=autocast, temperature=temperature,
                                                       whole=whole)
    ref = None
    if config.loss.kl_beta > 0 and reference is not None:
        ref = sequence_logprobs(reference, every, temperature=temperature)
    fresh = {sample.key: fresh_positions(sample) for sample in samples}
    result = UpdateResult()
    ranks = Ranks.current()  # several: each runs its share of micro-batches (trainer.ranks)
    scale = float(ranks.world) if ranks else 1.0  # DeepSpeed averages gradients over ranks: undo it
    for epoch in range(opt.epochs):
        for chunk in chunks:
            total = int(sum(float(batch.mask.sum()) for batch in chunk))  # the whole chunk's, on every rank
            for batch, weight in share(chunk, ranks):
                loss, stats = _micro_batch_loss(model, batch, epoch=epoch, total=total, config=config, autocast=autocast,
                                                temperature=temperature, whole=whole, prox=prox, ref=ref, fresh=fresh)
                _backward_if_finite(engine, loss, ranks=ranks, epoch=epoch, weight=weight * scale)
                if weight:
                    merge_stats(result.stats, stats)
                    result.loss += float(loss.detach())
                    result.tokens_processed += batch.real_tokens
            result.grad_norms.append(engine.step())
    if ranks:  # every rank reports the whole step
        _reduce_over_ranks(result, ranks)
    result.loss /= opt.epochs * len(chunks)  # mean over optimizer steps of the step loss
    result.lr = engine.lr()
    result.seconds = time.perf_counter() - started
    return result


def _minibatch_chunks(engine: PolicyEngine, samples: list[Sample], *, config: TrainerConfig) -> list[list[MicroBatch]]:
    """`samples` split into the step's minibatches (one optimizer step each), each packed into micro-batches
    of at most the configured (or, unset, the sized) tokens."""
    opt = config.optimizer
    max_tokens = opt.micro_batch_tokens or micro_batch_tokens_for(
        parameter_count(engine.module), activation_checkpointing=opt.activation_checkpointing)
    return [micro_batches(part, max_tokens=max_tokens) for part in split_minibatches(samples, count=opt.minibatches)]


def _proximal_logprobs(model: torch.nn.Module, every: list[MicroBatch], *, autocast: torch.autocast,
                       temperature: float, whole: PolicyEngine | None) -> dict[int, torch.Tensor]:
    """π_prox: each episode's logprobs under the weights at the step's start, computed in eval mode (no
    dropout) before any optimizer step; the model is left in training mode."""
    model.eval()
    try:
        with autocast:
            return sequence_logprobs(model, every, temperature=temperature, whole=whole)
    finally:
        model.train()


def _micro_batch_loss(
    model: torch.nn.Module, batch: MicroBatch, *, epoch: int, total: int, config: TrainerConfig,
    autocast: torch.autocast, temperature: float, whole: PolicyEngine | None, prox: dict[int, torch.Tensor] | None,
    ref: dict[int, torch.Tensor] | None, fresh: dict[int, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's forward (under `autocast`; its entropy on the first epoch) and its share of the step
    loss against π_prox (its own detached logprobs when `prox` is None), the reference and the lag-0 tokens."""
    with autocast:
        logp, entropy = token_logprobs(model, batch, temperature=temperature, with_entropy=epoch == 0, whole=whole)
    tensors = TokenTensors(
        logp=logp, prox_logp=logp.detach() if prox is None else _rows(prox, batch),
        behav_logp=batch.behav_logp, advantages=batch.advantages, mask=batch.mask, entropy=entropy,
        ref_logp=None if ref is None else _rows(ref, batch), fresh=_rows(fresh, batch),
    )
    return policy_loss(tensors, total_tokens=total, loss=config.loss)


def _backward_if_finite(engine: PolicyEngine, loss: torch.Tensor, *, ranks: Ranks | None, epoch: int,
                        weight: float) -> None:
    """Backpropagate `loss` × `weight`; NonFiniteStep instead when the loss is NaN or inf (on any rank)."""
    finite = ranks.all_finite(loss) if ranks else bool(torch.isfinite(loss.detach()))
    if not finite:  # never backpropagate NaN/inf into the weights (every rank skips alike)
        raise NonFiniteStep(f"loss: expected a finite number, got {float(loss.detach())} "
                            f"(epoch {epoch}); the step is skipped")
    engine.backward(loss * weight)


def _reduce_over_ranks(result: UpdateResult, ranks: Ranks) -> None:
    """Sum the step's stats, loss and tokens over every rank, so that each reports the whole step."""
    summed = ranks.reduce_stats({**result.stats, "_loss": result.loss, "_tokens": float(result.tokens_processed)})
    result.loss, result.tokens_processed = summed.pop("_loss"), int(summed.pop("_tokens"))
    result.stats = summed
