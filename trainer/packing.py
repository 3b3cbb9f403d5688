"""Samples → padded micro-batches of tensors, within a padded-token budget.

Position t of a sequence predicts token t+1, so every per-token tensor is (B, T−1) and lines up
with `logits[:, :-1]`. Right padding; padded positions have mask 0 and attention 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer.rollouts import Sample


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    targets: torch.Tensor  # (B, T-1) long: input_ids[:, 1:]
    mask: torch.Tensor  # (B, T-1) float: 1 where the target was sampled by the policy and carries loss weight
    behav_logp: torch.Tensor  # (B, T-1) float: vLLM's logprob of each sampled target
    advantages: torch.Tensor  # (B, T-1) float: the sample's advantage on each position
    sample_ids: list[int]  # (B,) each row's Sample.key, for per-row results

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())


def _pad(rows: Sequence[Sequence[float]], *, length: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros((len(rows), length), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def collate(samples: list[Sample]) -> MicroBatch:
    length = max(len(sample.token_ids) for sample in samples)
    ids = _pad([s.token_ids for s in samples], length=length, dtype=torch.long)  # (B, T)
    attention = _pad([[1] * len(s.token_ids) for s in samples], length=length, dtype=torch.long)
    mask = _pad([s.trained_mask for s in samples], length=length, dtype=torch.float32)[:, 1:]  # (B, T-1)
    behav = _pad([s.behaviour_logprobs for s in samples], length=length, dtype=torch.float32)[:, 1:]
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)[:, None] * mask
    return MicroBatch(input_ids=ids, attention_mask=attention, targets=ids[:, 1:], mask=mask,
                      behav_logp=behav * mask, advantages=advantages, sample_ids=[s.key for s in samples])


def micro_batches(samples: list[Sample], *, max_tokens: int) -> list[MicroBatch]:
    """Longest first, each micro-batch holding as many samples as fit `max_tokens` padded tokens
    (at least one, however long it is) and none shorter than half its longest (padding would waste
    more than half of the compute). The split does not change the loss: it is a token sum."""
    ordered = sorted(samples, key=lambda s: len(s.token_ids), reverse=True)
    batches: list[list[Sample]] = []
    for sample in ordered:
        current = batches[-1] if batches else None
        # Longest first: the first sample of a micro-batch sets its padded length.
        longest = len(current[0].token_ids) if current else 0
        if current is not None and (len(current) + 1) * longest <= max_tokens and 2 * len(sample.token_ids) > longest:
            current.append(sample)
        else:
            batches.append([sample])
    return [collate(batch) for batch in batches]


def split_minibatches(samples: list[Sample], *, count: int) -> list[list[Sample]]:
    """`count` near-equal slices of `samples` in order (fewer when there are fewer samples)."""
    count = max(1, min(count, len(samples)))
    size, extra = divmod(len(samples), count)
    slices, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        slices.append(samples[start:end])
        start = end
    return slices
