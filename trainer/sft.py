"""Supervised warm-up: next-token cross-entropy on demonstration token sequences, only where the
mask is 1 (the assistant's tokens), so a tiny model starts RL able to sometimes succeed.

    demos = [(token_ids, loss_mask), ...]
    report = sft_warmup(model=model, demonstrations=demos, steps=300, lr=3e-3, batch_size=16, seed=0)
    model.save_pretrained(out_dir)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.logprobs import token_logprobs
from trainer.packing import MicroBatch, micro_batches
from trainer.rollouts import Sample

Demonstration = tuple[list[int], list[int]]  # (token ids, loss mask), equal lengths


@dataclass(frozen=True)
class SftReport:
    steps: int
    first_loss: float
    last_loss: float
    seconds: float


def _micro_batches(demos: list[Demonstration], *, max_tokens: int) -> list[MicroBatch]:
    """Length-sorted micro-batches: a short demonstration is never padded to a long one's length."""
    samples = [Sample(episode_id=i, group_id=0, environment="", status="completed", termination="submitted",
                      reward=0.0, components={}, policy_version=0, token_ids=ids, loss_mask=mask,
                      behaviour_logprobs=[0.0] * len(ids)) for i, (ids, mask) in enumerate(demos)]
    return micro_batches(samples, max_tokens=max_tokens)


def sft_loss(model: torch.nn.Module, batch: MicroBatch, *, total_tokens: float) -> torch.Tensor:
    """Summed negative log-likelihood of the masked (assistant) tokens ÷ the whole batch's count. The
    output layer runs only on those tokens, in chunks (trainer.logprobs): a 49k vocabulary's logits
    over a whole micro-batch would be gigabytes."""
    logp, _ = token_logprobs(model, batch)  # (B, T-1), 0 where the mask is
    return -(logp * batch.mask).sum() / max(total_tokens, 1.0)


def sft_warmup(
    *, model: torch.nn.Module, demonstrations: list[Demonstration], steps: int, lr: float, batch_size: int,
    seed: int = 0, micro_batch_tokens: int = 4096, target_loss: float | None = None,
    stop_when: Callable[[], bool] | None = None,
) -> SftReport:
    """AdamW with a short warm-up then cosine decay; batches drawn with replacement from a seeded RNG.
    Stops early once the loss (averaged over the last 20 steps) is below `target_loss`, or once
    `stop_when()` (asked after every step, the model in eval mode) is true."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1.0 + torch.cos(torch.tensor(progress * torch.pi)).item())

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    started, first, last = time.perf_counter(), float("nan"), float("nan")
    recent: list[float] = []
    done = steps
    for step in range(steps):
        chunks = _micro_batches(rng.choices(demonstrations, k=batch_size), max_tokens=micro_batch_tokens)
        total = float(sum(chunk.mask.sum() for chunk in chunks))
        loss = torch.zeros(())
        for chunk in chunks:
            part = sft_loss(model, chunk, total_tokens=total)
            part.backward()
            loss += part.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        last = float(loss.detach())
        first = last if step == 0 else first
        recent = [*recent[-19:], last]
        if target_loss is not None and len(recent) == 20 and sum(recent) / 20 < target_loss:
            done = step + 1
            break
        if stop_when is not None:
            model.eval()
            stop = stop_when()
            model.train()
            if stop:
                done = step + 1
                break
    model.eval()
    return SftReport(steps=done, first_loss=first, last_loss=last, seconds=time.perf_counter() - started)
