"""Per-token logprobs (and entropy) of a micro-batch under the trainer's weights.

Only positions whose next token the policy sampled are scored: the decoder runs over the whole
sequence, but the output layer and the softmax (the larger half of a small model's compute) run
only on the sampled positions' hidden states, gathered first — prompts and tool output cost no
vocabulary projection (except under ZeRO-3, whose engine must run the whole forward).

The output layer and the log-softmax run over chunks of positions (`chunk_logits` logits at a time),
each chunk recomputed in the backward pass (`torch.utils.checkpoint`): the (N, V) float32 logits are
never held whole, so their memory is O(chunk × V), not O(N × V) — at a 49k vocabulary 4.6k sampled
positions are 0.9 GB of logits, and the log-softmax's backward held several such copies. The price is
one more head matmul per chunk in the backward pass.

The output layer runs in float32 even under the step's bf16 autocast (`optimizer.autocast`): logits rounded
to bf16 before the log-softmax doubled the mismatch against vLLM's float32 logprobs (k3 1.9e-3 against
8.0e-4 with the head in float32, on a sharpened Qwen2: the RL review's e4); the decoder may run in bf16.
Under ZeRO-3 (`whole`) the engine's own forward computes the head, in the autocast dtype (those logits are
whole; the float32 log-softmax over them is still chunked).

The logits are divided by the sampling temperature first: vLLM (`--logprobs-mode
processed_logprobs`) reports the logprobs of the distribution it sampled from, which is the
temperature-scaled one, so the trainer's numbers must be of the same distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from trainer.lora import is_lora
from trainer.packing import MicroBatch

CHUNK_LOGITS = 1 << 25
"""Logits per chunk (positions × vocabulary): 128 MiB of float32, about 680 positions at a 49k
vocabulary; a chunk's forward and backward hold a few such buffers. Large enough that the head's matmul
runs at full speed, small enough to be noise beside a 100M model's weights and optimizer state."""

Project = Callable[[torch.Tensor], torch.Tensor]
"""Rows of a chunk → their float32 logits: (n, H) hidden states through the head, or (n, V) logits cast."""


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The causal LM's decoder stack and its output layer (through a peft wrapper)."""
    base: Any = model.get_base_model() if is_lora(model) else model  # type: ignore[operator]
    decoder = getattr(base, str(getattr(base, "base_model_prefix", "")), None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Module):
        raise TypeError(f"expected a Hugging Face causal LM with a decoder and an lm_head, got {type(base).__name__}")
    return decoder, head


def float32_head(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """head(hidden) as float32 logits, computed in float32 whatever autocast is on: (N, H) → (N, V). A
    head whose weights are themselves lower precision runs in theirs (its rounding is the weights')."""
    with torch.autocast(hidden.device.type, enabled=False):
        return head(hidden.to(next(head.parameters()).dtype)).float()


def vocabulary_size(head: torch.nn.Module) -> int:
    """Rows of the output layer (a Linear's out_features, else its weight's first dimension)."""
    size = getattr(head, "out_features", None)
    if isinstance(size, int):
        return size
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    raise TypeError(f"expected an output layer with out_features or a weight, got {type(head).__name__}")


def sampled_rows(
    model: torch.nn.Module, batch: MicroBatch, *, whole: Callable[..., Any] | None = None,
) -> tuple[torch.Tensor, Project, int]:
    """(rows, project, V): what the head still has to turn into logits at the sampled positions — their
    (N, H) hidden states and the float32 head, or under `whole` (e.g. a ZeRO-3 engine, whose parameter
    gathering follows its own forward) the whole forward's (N, V) logits and a float32 cast."""
    active = batch.mask.bool()  # (B, T-1): position t predicts token t+1
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    if whole is not None:
        logits = whole(**inputs).logits[:, :-1][active]  # (N, V), the autocast dtype
        return logits, lambda rows: rows.float(), int(logits.shape[-1])
    decoder, head = decoder_and_head(model)
    hidden = decoder(**inputs).last_hidden_state  # (B, T, H), bf16 under autocast
    return hidden[:, :-1][active], lambda rows: float32_head(head, rows), vocabulary_size(head)


def _scored(
    rows: torch.Tensor, targets: torch.Tensor, *, project: Project, temperature: float, with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp, entropy) of one chunk, each (n,): the temperature-scaled log-softmax at the targets."""
    logits = project(rows)  # (n, V) float32
    if temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # (n,)
    picked = logits.gather(-1, targets[:, None])[:, 0] - log_norm  # (n,)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)  # (n, V)
            entropy = log_norm - (probs * logits).sum(-1)  # H = logZ − E[logit]
    return picked, entropy


def chunked_logprobs(
    rows: torch.Tensor, targets: torch.Tensor, *, project: Project, vocabulary: int, temperature: float = 1.0,
    with_entropy: bool = False, chunk_logits: int | None = CHUNK_LOGITS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp, entropy), each (N,), of `targets` under project(rows) / temperature, `chunk_logits` logits
    at a time, each chunk recomputed in backward when a gradient is to flow. `chunk_logits=None`: all N
    rows at once, the (N, V) logits kept for backward (the reference the chunked path is tested against)."""
    size = rows.shape[0] if chunk_logits is None else max(1, chunk_logits // vocabulary)
    recompute = chunk_logits is not None and torch.is_grad_enabled() and rows.requires_grad
    forward_done = False  # the backward's recomputation skips the entropy (no gradient, already known)

    def scored(part: torch.Tensor, part_targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return _scored(part, part_targets, project=project, temperature=temperature,
                       with_entropy=with_entropy and not forward_done)

    picked, entropy = [], []
    for start in range(0, max(rows.shape[0], 1), max(size, 1)):
        part, part_targets = rows[start:start + size], targets[start:start + size]
        if recompute:
            logp, ent = checkpoint(scored, part, part_targets, use_reentrant=False)
        else:
            logp, ent = scored(part, part_targets)
        picked.append(logp)
        if ent is not None:
            entropy.append(ent)
    forward_done = True
    return torch.cat(picked), torch.cat(entropy) if with_entropy else None


def token_logprobs(
    model: torch.nn.Module, batch: MicroBatch, *, temperature: float = 1.0, with_entropy: bool = False,
    whole: Callable[..., Any] | None = None, chunk_logits: int | None = CHUNK_LOGITS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp, entropy): each (B, T−1); logp[b, t] = log π(targets[b, t] | input_ids[b, :t+1]) where the
    token was sampled, 0 elsewhere. Gradients flow through logp unless called under torch.no_grad();
    entropy never carries one."""
    active = batch.mask.bool()
    rows, project, vocabulary = sampled_rows(model, batch, whole=whole)  # (N, H) or (N, V)
    picked, flat = chunked_logprobs(rows, batch.targets[active], project=project, vocabulary=vocabulary,
                                    temperature=temperature, with_entropy=with_entropy, chunk_logits=chunk_logits)
    logp = torch.zeros(batch.mask.shape, dtype=picked.dtype, device=picked.device)  # (B, T-1)
    logp = logp.masked_scatter(active, picked)
    entropy = None if flat is None else torch.zeros_like(batch.mask).masked_scatter(active, flat)
    return logp, entropy


@torch.no_grad()
def sequence_logprobs(
    model: torch.nn.Module, batches: list[MicroBatch], *, temperature: float = 1.0,
    whole: Callable[..., Any] | None = None,
) -> dict[int, torch.Tensor]:
    """Row key (Sample.key: the episode id outside an update) → (T−1,) logprobs of its tokens (0 where not sampled), without gradients."""
    out: dict[int, torch.Tensor] = {}
    for batch in batches:
        logp, _ = token_logprobs(model, batch, temperature=temperature, whole=whole)
        lengths = batch.attention_mask.sum(-1) - 1  # (B,) scored positions per row
        for row, key in enumerate(batch.sample_ids):
            out[key] = logp[row, : int(lengths[row])].clone()
    return out
