"""Training resources sized from the policy's parameter count: the micro-batch's padded tokens, and
whether the decoder recomputes its activations in backward.

    sizing = training_sizing(parameters=134_515_008)  # TrainingSizing(micro_batch_tokens=2048, ...)

The decoder's saved activations are what a step's memory grows with, per padded token of a micro-batch
(weights, gradients and AdamW state are a fixed 16 bytes a parameter; the output layer's logits are
chunked, trainer.logprobs). Measured on a SmolLM2-135M-shaped Llama (30 layers, hidden 576, float32,
16 rollouts of ~600 tokens, one `trainer.step.update`; issue 48): about 1.2 MB a padded token, i.e.
parameters ÷ 110 bytes. `bench/trainer_memory.py` prints the peak resident set of that update: 6.11 GB
at the sized 2048 tokens a micro-batch, 15.92 GB at 8192 (docs/benchmarks.md#trainer); activation
checkpointing (one more decoder forward in backward) cut the 8192-token peak about 2.6× in the measurement
the constants came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # recipes size a model before anything imports torch
    import torch

ACTIVATION_BUDGET_BYTES = 3 << 30
"""Saved activations one micro-batch may hold: with a 135M model's 2.2 GB of weights and optimizer
state, a step stays under 8 GB."""
PARAMETERS_PER_ACTIVATION_BYTE = 110
"""A token's saved activations ≈ parameters ÷ this, in bytes (the measurement above)."""
CHECKPOINTING_SAVES = 4
"""Activation checkpointing divides the per-token activations by about this (measured 4.7×)."""
MAX_MICRO_BATCH_TOKENS = 8192
"""The tiny models' micro-batch, and the most any model gets (longer rows gain no speed on CPU)."""
MIN_MICRO_BATCH_TOKENS = 1024
"""Below this without checkpointing, the decoder recomputes its activations instead (shorter rows
would waste the matmuls)."""


@dataclass(frozen=True)
class TrainingSizing:
    micro_batch_tokens: int
    """Padded tokens per forward/backward (`optimizer.micro_batch_tokens`)."""
    activation_checkpointing: bool
    """Whether the decoder recomputes its activations in backward (`optimizer.activation_checkpointing`)."""


def _power_of_two_at_most(value: float) -> int:
    return 1 << max(0, int(value).bit_length() - 1)


def micro_batch_tokens_for(parameters: int, *, activation_checkpointing: bool = False) -> int:
    """The padded tokens a micro-batch may hold so that its activations fit the budget: a power of two,
    at most MAX_MICRO_BATCH_TOKENS (and never below 64, the config's floor)."""
    if parameters < 1:
        raise ValueError(f"parameters: expected a positive count, got {parameters}")
    per_token = parameters / PARAMETERS_PER_ACTIVATION_BYTE / (CHECKPOINTING_SAVES if activation_checkpointing else 1)
    return max(64, min(MAX_MICRO_BATCH_TOKENS, _power_of_two_at_most(ACTIVATION_BUDGET_BYTES / per_token)))


def training_sizing(*, parameters: int) -> TrainingSizing:
    """The micro-batch that fits the budget; activation checkpointing only where that micro-batch
    would fall below MIN_MICRO_BATCH_TOKENS (it costs a decoder forward)."""
    tokens = micro_batch_tokens_for(parameters)
    if tokens >= MIN_MICRO_BATCH_TOKENS:
        return TrainingSizing(micro_batch_tokens=tokens, activation_checkpointing=False)
    return TrainingSizing(micro_batch_tokens=micro_batch_tokens_for(parameters, activation_checkpointing=True),
                          activation_checkpointing=True)


def parameter_count(model: torch.nn.Module) -> int:
    """Every parameter of the model, trainable or not, a tied matrix once (whole under ZeRO-3)."""
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())  # ZeRO-3: partitioned
