"""Sequence packing: samples laid end to end in one row, no padding token computed.

    batches = pack(samples, max_tokens=8192)
    logp, entropy = packed_token_logprobs(model, batches[0], temperature=1.0, with_entropy=True)

Each sequence's positions restart at 0 (`position_ids`), and neither an attention mask nor a KV cache
is passed: Hugging Face's mask builder then detects the packed sequences from the position ids and makes attention
block-diagonal causal, so no token attends across a sequence boundary (tested). The position that
would predict the next sequence's first token is masked out of the loss. The per-token tensors are
(1, L−1) like a micro-batch's (B, T−1), so `trainer.loss.policy_loss` applies unchanged; the loss is a
token sum, so packing gives the same loss and gradients as padded micro-batches (tested).

Cost caveat: without a variable-length attention kernel (flash-attention's varlen; not on CPU), SDPA
computes the whole row's L×L scores and masks the cross-sample blocks, so packing removes the padding
from every projection and MLP but adds attention work that grows with the row length: keep rows
short (`max_tokens` about twice the longest sample) unless a varlen kernel is in use. Whether it pays
is to be measured (bench/trainer.py) before it replaces padded micro-batches.

Not wired into `trainer.step.update` yet; ZeRO-3's whole-model forward and models without
position-id packing support are out of its scope.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.logprobs import chunked_logprobs, decoder_and_head, float32_head, vocabulary_size
from trainer.rollouts import Sample


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # (1, L) long: the samples' tokens end to end
    position_ids: torch.Tensor  # (1, L) long: restarting at 0 for each sample
    targets: torch.Tensor  # (1, L-1) long: input_ids[:, 1:]
    mask: torch.Tensor  # (1, L-1) float: 1 where the target was sampled, in the same sample
    behav_logp: torch.Tensor  # (1, L-1)
    advantages: torch.Tensor  # (1, L-1)
    sample_ids: list[int]
    spans: list[tuple[int, int]]  # (start, length) of each sample in the row

    @property
    def real_tokens(self) -> int:
        return int(self.input_ids.numel())

    padded_tokens = real_tokens  # nothing is padding


def collate_packed(samples: list[Sample]) -> PackedBatch:
    ids: list[int] = []
    positions: list[int] = []
    mask: list[float] = []
    behav: list[float] = []
    advantages: list[float] = []
    spans = []
    for sample in samples:
        start, length = len(ids), len(sample.token_ids)
        spans.append((start, length))
        ids += sample.token_ids
        positions += range(length)
        # Target t+1 of the row belongs to this sample for t = start … start+length−2; the last
        # position would predict the next sample's first token: masked (0) below by the shift.
        mask += [float(m) for m in sample.trained_mask[1:]] + [0.0]
        behav += [float(b) for b in sample.behaviour_logprobs[1:]] + [0.0]
        advantages += [sample.advantage] * (length - 1) + [0.0]
    row = torch.tensor(ids, dtype=torch.long)[None]  # (1, L)
    mask_t = torch.tensor(mask[:-1], dtype=torch.float32)[None]  # (1, L-1): the row's last position has no target
    return PackedBatch(
        input_ids=row, position_ids=torch.tensor(positions, dtype=torch.long)[None], targets=row[:, 1:],
        mask=mask_t, behav_logp=torch.tensor(behav[:-1])[None] * mask_t,
        advantages=torch.tensor(advantages[:-1])[None] * mask_t, sample_ids=[s.key for s in samples],
        spans=spans)


def pack(samples: list[Sample], *, max_tokens: int) -> list[PackedBatch]:
    """First-fit decreasing into rows of at most `max_tokens` tokens (a longer sample gets a row of its
    own). The split does not change the loss: it is a token sum."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive integer, got {max_tokens}")
    rows: list[list[Sample]] = []
    sizes: list[int] = []
    for sample in sorted(samples, key=lambda s: len(s.token_ids), reverse=True):
        length = len(sample.token_ids)
        slot = next((i for i, size in enumerate(sizes) if size + length <= max_tokens), None)
        if slot is None:
            rows.append([sample])
            sizes.append(length)
        else:
            rows[slot].append(sample)
            sizes[slot] += length
    return [collate_packed(row) for row in rows]


def packed_token_logprobs(
    model: torch.nn.Module, batch: PackedBatch, *, temperature: float = 1.0, with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp, entropy), each (1, L−1), as `trainer.logprobs.token_logprobs` for a micro-batch: the
    output layer only at the sampled positions, in float32 and in chunks."""
    decoder, head = decoder_and_head(model)
    # No cache: with one, Hugging Face's mask builder skips the packed-sequence detection (and would
    # let tokens attend across samples).
    hidden = decoder(input_ids=batch.input_ids, position_ids=batch.position_ids,
                     use_cache=False).last_hidden_state  # (1, L, H)
    active = batch.mask.bool()
    picked, flat = chunked_logprobs(hidden[:, :-1][active], batch.targets[active],
                                    project=lambda rows: float32_head(head, rows), vocabulary=vocabulary_size(head),
                                    temperature=temperature, with_entropy=with_entropy)  # (N,), (N,)
    logp = torch.zeros(batch.mask.shape, dtype=picked.dtype).masked_scatter(active, picked)
    entropy = None if flat is None else torch.zeros_like(batch.mask).masked_scatter(active, flat)
    return logp, entropy


def per_sample(values: torch.Tensor, batch: PackedBatch) -> dict[int, torch.Tensor]:
    """Episode id → its (T−1,) slice of a (1, L−1) tensor, as `sequence_logprobs` returns them."""
    return {episode_id: values[0, start:start + length - 1]
            for episode_id, (start, length) in zip(batch.sample_ids, batch.spans, strict=True)}
