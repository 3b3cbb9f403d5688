"""Per-token logprobs (and entropy) of a micro-batch under the trainer's weights.

The logits are divided by the sampling temperature first: vLLM (`--logprobs-mode
processed_logprobs`) reports the logprobs of the distribution it sampled from, which is the
temperature-scaled one, so the trainer's numbers must be of the same distribution.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.packing import MicroBatch

Forward = Callable[..., object]


def token_logprobs(
    forward: Forward, batch: MicroBatch, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp, entropy): each (B, T−1); logp[b, t] = log π(targets[b, t] | input_ids[b, :t+1]).

    `forward` is the model (or a DeepSpeed engine) called as forward(input_ids=…, attention_mask=…).
    Gradients flow through logp unless called under torch.no_grad(); entropy never carries one.
    """
    output = forward(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    logits = output.logits[:, :-1].float()  # type: ignore[attr-defined]  # (B, T-1, V)
    if temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # (B, T-1)
    picked = logits.gather(-1, batch.targets[..., None])[..., 0]  # (B, T-1)
    logp = (picked - log_norm) * batch.mask  # 0 on environment and padding positions
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)  # (B, T-1, V)
            entropy = (log_norm - (probs * logits).sum(-1)) * batch.mask  # H = logZ − E[logit]
    return logp, entropy


@torch.no_grad()
def sequence_logprobs(
    forward: Forward, batches: list[MicroBatch], *, temperature: float = 1.0
) -> dict[int, torch.Tensor]:
    """Episode id → (T−1,) logprobs of its tokens (0 where not sampled), without gradients."""
    out: dict[int, torch.Tensor] = {}
    for batch in batches:
        logp, _ = token_logprobs(forward, batch, temperature=temperature)
        lengths = batch.attention_mask.sum(-1) - 1  # (B,) scored positions per row
        for row, episode_id in enumerate(batch.sample_ids):
            out[episode_id] = logp[row, : int(lengths[row])].clone()
    return out
