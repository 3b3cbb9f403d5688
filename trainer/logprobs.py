"""Per-token logprobs (and entropy) of a micro-batch under the trainer's weights.

Only positions whose next token the policy sampled are scored: the decoder runs over the whole
sequence, but the output layer and the softmax (the larger half of a small model's compute) run
only on the sampled positions' hidden states, gathered first — prompts and tool output cost no
vocabulary projection (except under ZeRO-3, whose engine must run the whole forward).

The output layer runs in float32 even under the step's bf16 autocast (`optimizer.autocast`): logits rounded
to bf16 before the log-softmax doubled the mismatch against vLLM's float32 logprobs (k3 1.9e-3 against
8.0e-4 with the head in float32, on a sharpened Qwen2: the RL review's e4); the decoder may run in bf16.
Under ZeRO-3 (`whole`) the engine's own forward computes the head, in the autocast dtype.

The logits are divided by the sampling temperature first: vLLM (`--logprobs-mode
processed_logprobs`) reports the logprobs of the distribution it sampled from, which is the
temperature-scaled one, so the trainer's numbers must be of the same distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainer.lora import is_lora
from trainer.packing import MicroBatch


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The causal LM's decoder stack and its output layer (through a peft wrapper)."""
    base: Any = model.get_base_model() if is_lora(model) else model  # type: ignore[operator]
    decoder = getattr(base, str(getattr(base, "base_model_prefix", "")), None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Module):
        raise TypeError(f"expected a Hugging Face causal LM with a decoder and an lm_head, got {type(base).__name__}")
    return decoder, head


def sampled_positions(
    model: torch.nn.Module, batch: MicroBatch, *, temperature: float = 1.0, whole: Callable[..., Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, targets) at the sampled positions only: (N, V) and (N,), N = batch.mask.sum().

    `whole`: call this (e.g. a ZeRO-3 engine, whose parameter gathering follows its own forward)
    on the whole sequence instead, and pick the sampled positions from the full logits."""
    active = batch.mask.bool()  # (B, T-1): position t predicts token t+1
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    if whole is not None:
        logits = whole(**inputs).logits[:, :-1][active].float()  # (N, V)
    else:
        decoder, head = decoder_and_head(model)
        hidden = decoder(**inputs).last_hidden_state  # (B, T, H), bf16 under autocast
        logits = float32_head(head, hidden[:, :-1][active])  # (N, V)
    if temperature != 1.0:
        logits = logits / temperature
    return logits, batch.targets[active]


def float32_head(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """head(hidden) as float32 logits, computed in float32 whatever autocast is on: (N, H) → (N, V). A
    head whose weights are themselves lower precision runs in theirs (its rounding is the weights')."""
    with torch.autocast(hidden.device.type, enabled=False):
        return head(hidden.to(next(head.parameters()).dtype)).float()


def token_logprobs(
    model: torch.nn.Module, batch: MicroBatch, *, temperature: float = 1.0, with_entropy: bool = False,
    whole: Callable[..., Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp, entropy): each (B, T−1); logp[b, t] = log π(targets[b, t] | input_ids[b, :t+1]) where the
    token was sampled, 0 elsewhere. Gradients flow through logp unless called under torch.no_grad();
    entropy never carries one."""
    logits, targets = sampled_positions(model, batch, temperature=temperature, whole=whole)  # (N, V), (N,)
    log_norm = torch.logsumexp(logits, dim=-1)  # (N,)
    picked = logits.gather(-1, targets[:, None])[:, 0] - log_norm  # (N,)
    active = batch.mask.bool()
    logp = torch.zeros(batch.mask.shape, dtype=picked.dtype, device=picked.device)  # (B, T-1)
    logp = logp.masked_scatter(active, picked)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)  # (N, V)
            flat = log_norm - (probs * logits).sum(-1)  # H = logZ − E[logit]
            entropy = torch.zeros_like(batch.mask).masked_scatter(active, flat)
    return logp, entropy


@torch.no_grad()
def sequence_logprobs(
    model: torch.nn.Module, batches: list[MicroBatch], *, temperature: float = 1.0,
    whole: Callable[..., Any] | None = None,
) -> dict[int, torch.Tensor]:
    """Episode id → (T−1,) logprobs of its tokens (0 where not sampled), without gradients."""
    out: dict[int, torch.Tensor] = {}
    for batch in batches:
        logp, _ = token_logprobs(model, batch, temperature=temperature, whole=whole)
        lengths = batch.attention_mask.sum(-1) - 1  # (B,) scored positions per row
        for row, episode_id in enumerate(batch.sample_ids):
            out[episode_id] = logp[row, : int(lengths[row])].clone()
    return out
