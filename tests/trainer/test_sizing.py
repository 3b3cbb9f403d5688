"""Training resources sized from the policy (trainer/sizing.py): the micro-batch a run gets when its config
leaves `micro_batch_tokens` unset, and `activation_checkpointing`, which changes memory, not gradients."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from core.schemas.trainer import TrainerConfig
from trainer.logprobs import token_logprobs
from trainer.loop import load_policy
from trainer.packing import micro_batches
from trainer.rollouts import Sample
from trainer.sizing import micro_batch_tokens_for, parameter_count, training_sizing


def test_the_micro_batch_shrinks_with_the_model_and_checkpointing_comes_only_past_the_floor() -> None:
    assert TrainerConfig().optimizer.micro_batch_tokens is None  # sized by the trainer
    assert micro_batch_tokens_for(800_000) == 8192  # the tiny model: what it always had
    assert micro_batch_tokens_for(134_515_008) == 2048  # SmolLM2-135M: 6 GB a step, not 13 (issue 48)
    assert micro_batch_tokens_for(134_515_008, activation_checkpointing=True) == 8192
    sizes = [micro_batch_tokens_for(n) for n in (10**6, 10**7, 10**8, 10**9, 10**10)]
    assert sizes == sorted(sizes, reverse=True) and all(s & (s - 1) == 0 and s >= 64 for s in sizes)
    assert not training_sizing(parameters=134_515_008).activation_checkpointing
    assert training_sizing(parameters=1_500_000_000).activation_checkpointing


def test_a_tied_head_is_counted_once() -> None:
    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert parameter_count(model) == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def test_activation_checkpointing_gives_the_same_gradients(tiny_model_dir: Path) -> None:
    rng = random.Random(0)
    samples = [Sample(episode_id=i, group_id=0, environment="e", status="completed", termination="submitted",
                      reward=0.0, components={}, policy_version=0,
                      token_ids=[rng.randrange(3, 2000) for _ in range(40)], loss_mask=[0] * 10 + [1] * 30,
                      behaviour_logprobs=[0.0] * 10 + [-7.0] * 30) for i in range(3)]
    (batch,) = micro_batches(samples, max_tokens=4096)
    grads = []
    for checkpointing in (False, True):
        config = TrainerConfig.model_validate({"optimizer": {"activation_checkpointing": checkpointing}})
        model = load_policy(str(tiny_model_dir), config=config).train()
        assert bool(getattr(model, "is_gradient_checkpointing", False)) == checkpointing
        logp, _ = token_logprobs(model, batch)
        logp.sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6)
