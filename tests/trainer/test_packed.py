"""Sequence packing (trainer/packed.py) computes no padding and gives the same loss and gradients as
the padded micro-batches the trainer uses today (trainer/packing.py), on the real tiny model with
samples of very different lengths (the case where padding wastes most)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.config import LossConfig
from trainer.logprobs import token_logprobs
from trainer.loss import TokenTensors, policy_loss
from trainer.packed import pack, packed_token_logprobs, per_sample
from trainer.packing import micro_batches
from trainer.rollouts import Sample


def _samples(*, vocab: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for index, (prompt, completion) in enumerate([(40, 30), (5, 3), (17, 60), (9, 9), (60, 2), (3, 25)]):
        tokens = [rng.randrange(3, vocab) for _ in range(prompt + completion)]
        sample = Sample(episode_id=100 + index, group_id=index // 2, environment="e", status="completed",
                        termination="submitted", reward=0.0, components={}, policy_version=0, token_ids=tokens,
                        loss_mask=[0] * prompt + [1] * completion,
                        behaviour_logprobs=[0.0] * prompt + [-rng.uniform(6.0, 9.0) for _ in range(completion)])
        sample.advantage = rng.uniform(-1.0, 1.0)
        out.append(sample)
    return out


def _loss_and_grads(model: torch.nn.Module, parts: list, logprobs) -> tuple[float, dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    model.zero_grad(set_to_none=True)
    total = int(sum(float(b.mask.sum()) for b in parts))
    value = 0.0
    for batch in parts:
        logp, entropy = logprobs(model, batch)
        tensors = TokenTensors(logp=logp, prox_logp=logp.detach(), behav_logp=batch.behav_logp,
                               advantages=batch.advantages, mask=batch.mask, entropy=entropy)
        loss, _ = policy_loss(tensors, total_tokens=total, loss=LossConfig())
        loss.backward()
        value += float(loss.detach())
    return value, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("max_tokens", [64, 200, 10_000])
def test_packed_and_padded_steps_give_the_same_loss_and_gradients(tiny_model_dir: Path, max_tokens: int) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples = _samples(vocab=model.config.vocab_size)
    padded = micro_batches(samples, max_tokens=max_tokens)
    packed = pack(samples, max_tokens=max_tokens)
    real = sum(len(s.token_ids) for s in samples)
    assert sum(b.input_ids.numel() for b in packed) == real  # not one padding token computed
    assert sum(b.padded_tokens for b in padded) > real  # …where the padded layout computes some
    loss_a, grads_a = _loss_and_grads(model, padded, lambda m, b: token_logprobs(m, b, with_entropy=True))
    loss_b, grads_b = _loss_and_grads(model, packed, lambda m, b: packed_token_logprobs(m, b, with_entropy=True))
    assert loss_a != 0.0
    assert loss_b == pytest.approx(loss_a, abs=1e-6)
    assert grads_a.keys() == grads_b.keys()
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_no_token_attends_across_a_sample_boundary(tiny_model_dir: Path) -> None:
    """Change every token of the first sample in a row: the other samples' logprobs must not move."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    samples = _samples(vocab=model.config.vocab_size)
    [row] = pack(samples, max_tokens=10_000)
    first = samples.index(max(samples, key=lambda s: len(s.token_ids)))  # packed first (longest first)
    changed = [Sample(**{**vars(s), "token_ids": [t % 50 + 3 for t in reversed(s.token_ids)]}) if i == first else s
               for i, s in enumerate(samples)]
    [other] = pack(changed, max_tokens=10_000)
    with torch.no_grad():
        before = per_sample(packed_token_logprobs(model, row)[0], row)
        after = per_sample(packed_token_logprobs(model, other)[0], other)
    moved = samples[first].episode_id
    assert not torch.equal(before[moved], after[moved])
    for episode_id in before:
        if episode_id != moved:
            torch.testing.assert_close(after[episode_id], before[episode_id], atol=1e-6, rtol=0)


@pytest.mark.parametrize("max_tokens", [0, -5])
def test_a_non_positive_budget_is_refused(max_tokens: int) -> None:
    with pytest.raises(ValueError, match=f"max_tokens: expected a positive integer, got {max_tokens}"):
        pack([], max_tokens=max_tokens)
