"""The output layer and log-softmax run over chunks of positions, each recomputed in backward
(trainer.logprobs, issue 48): the same logprobs, entropy and gradients as the whole (N, V) logits at
once, and a peak memory below one copy of those logits at a large vocabulary."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from trainer.logprobs import token_logprobs
from trainer.packing import MicroBatch, micro_batches
from trainer.rollouts import Sample


def _batch(*, vocab: int, rows: int, length: int, seed: int = 0) -> MicroBatch:
    """Rows of environment tokens then sampled ones, of different lengths (some padding)."""
    rng = random.Random(seed)
    samples = []
    for index in range(rows):
        prompt, completion = rng.randint(3, length // 3), rng.randint(length // 3, 2 * length // 3)
        samples.append(Sample(
            episode_id=index, group_id=0, environment="e", status="completed", termination="submitted", reward=0.0,
            components={}, policy_version=0, token_ids=[rng.randrange(3, vocab) for _ in range(prompt + completion)],
            loss_mask=[0] * prompt + [1] * completion, behaviour_logprobs=[0.0] * prompt + [-7.0] * completion))
    (batch,) = micro_batches(samples, max_tokens=rows * length)
    return batch


def _logprobs_and_grads(
    model: torch.nn.Module, batch: MicroBatch, *, chunk_logits: int | None, temperature: float,
    whole: Callable[..., Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logp, entropy = token_logprobs(model, batch, temperature=temperature, with_entropy=True, whole=whole,
                                   chunk_logits=chunk_logits)
    weights = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)  # every position its own gradient
    (logp * weights).sum().backward()
    assert entropy is not None
    return logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("zero3_whole", [False, True])
def test_chunked_logprobs_entropy_and_gradients_equal_the_whole_logits(
    tiny_model_dir: Path, temperature: float, zero3_whole: bool,
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).train()
    vocab = model.config.vocab_size
    batch = _batch(vocab=vocab, rows=3, length=60)
    sampled = int(batch.mask.sum())
    whole = model if zero3_whole else None  # the ZeRO-3 path: the model's own forward, then pick the rows
    logp_a, ent_a, grads_a = _logprobs_and_grads(model, batch, chunk_logits=None, temperature=temperature, whole=whole)
    logp_b, ent_b, grads_b = _logprobs_and_grads(model, batch, chunk_logits=7 * vocab, temperature=temperature,
                                                 whole=whole)  # 7 positions a chunk: many chunks, a ragged last
    assert sampled > 3 * 7 and sampled % 7
    torch.testing.assert_close(logp_b, logp_a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent_b, ent_a, rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and "lm_head.weight" in grads_a
    for name, grad in grads_a.items():  # float32 sums in another order: to 1e-5 of the gradient's scale
        scale = float(grad.abs().max())
        assert torch.allclose(grads_b[name], grad, rtol=1e-5, atol=1e-5 * scale), (name, scale)
    with torch.no_grad():  # the proximal/reference pass: chunked without recomputation
        logp_c, _ = token_logprobs(model, batch, temperature=temperature, whole=whole, chunk_logits=7 * vocab)
    torch.testing.assert_close(logp_c, logp_a, rtol=1e-5, atol=1e-6)


def _peak_allocated_bytes(run: Callable[[], None]) -> int:
    """The highest total of CPU bytes allocated and not yet freed while `run` ran, from the profiler's
    allocation events in time order (deterministic: what torch allocates, not what the OS shows)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]  # type: ignore[union-attr]
    total = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        total += event.nbytes()
        peak = max(peak, total)
    return peak


def test_chunked_logprobs_never_hold_the_whole_logits_at_a_large_vocabulary() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16384, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    model = LlamaForCausalLM(config).train()
    batch = _batch(vocab=config.vocab_size, rows=4, length=300)
    logits_bytes = int(batch.mask.sum()) * config.vocab_size * 4  # one float32 (N, V) copy

    def step(chunk_logits: int | None) -> Callable[[], None]:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            logp, _ = token_logprobs(model, batch, with_entropy=True, chunk_logits=chunk_logits)
            logp.sum().backward()
        return run

    whole = _peak_allocated_bytes(step(None))
    chunked = _peak_allocated_bytes(step(1 << 20))  # 64 positions a chunk
    assert whole > 2 * logits_bytes  # the plain path holds several (N, V) buffers at once
    # Measured: 228 MB whole, 23 MB chunked (the chunks' buffers, the weights' gradients, the decoder).
    assert chunked < logits_bytes and 4 * chunked < whole, (chunked, whole, logits_bytes)
