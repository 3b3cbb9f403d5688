"""The optimisation backends give the same update: plain PyTorch, a real DeepSpeed ZeRO-2/3 engine
(single rank, gloo on CPU), and LoRA whose merged export scores like the adapter model."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.advantages import assign_advantages
from trainer.config import TrainerConfig
from trainer.engine import PolicyEngine, make_engine
from trainer.logprobs import sequence_logprobs
from trainer.packing import collate
from trainer.rollouts import Group, Sample
from trainer.step import update


def _samples() -> list[Sample]:
    samples = []
    for i in range(4):
        mask = [0] * 5 + [1] * (8 + 3 * i)
        samples.append(Sample(
            episode_id=i, group_id=0, environment="a", status="completed", termination="submitted",
            reward=float(i % 2), components={}, policy_version=0,
            token_ids=[(11 * t + 5 * i) % 300 + 3 for t in range(len(mask))], loss_mask=mask,
            behaviour_logprobs=[-7.0 if m else 0.0 for m in mask], score=float(i % 2)))
    assign_advantages([Group(id=0, group_index=0, environment="a", policy_version=0, samples=samples)],
                      scale_by_std=False)
    return samples


def _train(engine: PolicyEngine, config: TrainerConfig, steps: int = 2) -> list[float]:
    return [update(engine, _samples(), config=config).loss for _ in range(steps)]


def _config(**extra: object) -> TrainerConfig:
    return TrainerConfig.model_validate({"optimizer": {"lr": 1e-3, "micro_batch_tokens": 64}, **extra})


@pytest.fixture
def base(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_matches_plain_pytorch(base: torch.nn.Module, stage: int, tmp_path: Path) -> None:
    plain_config, ds_config = _config(), _config(deepspeed={"stage": stage})
    plain = make_engine(model=copy.deepcopy(base), config=plain_config)
    zero = make_engine(model=copy.deepcopy(base), config=ds_config)
    assert type(zero).__name__ == "DeepSpeedEngine"
    plain_losses, zero_losses = _train(plain, plain_config), _train(zero, ds_config)
    assert all(math.isfinite(loss) for loss in zero_losses)
    assert zero_losses == pytest.approx(plain_losses, rel=1e-4, abs=1e-7)
    exported, expected = zero.export_state_dict(), plain.export_state_dict()
    assert exported.keys() == expected.keys()
    for name, tensor in expected.items():
        # Adam moves every weight by ~lr (1e-3) per step; reduction order differs under ZeRO (a gradient
        # near 0 gets a different sign now and then), so agree to 5% of one step.
        torch.testing.assert_close(exported[name], tensor, rtol=1e-4, atol=5e-5)

    # Checkpoint round trip: a fresh engine loaded from it takes the same next step.
    zero.save(tmp_path)
    again = make_engine(model=copy.deepcopy(base), config=ds_config)
    again.load(tmp_path)
    assert _train(again, ds_config, steps=1) == pytest.approx(_train(zero, ds_config, steps=1), rel=1e-5)


def test_torch_checkpoint_round_trip_restores_the_optimizer(base: torch.nn.Module, tmp_path: Path) -> None:
    config = _config()
    first = make_engine(model=copy.deepcopy(base), config=config)
    _train(first, config)
    first.save(tmp_path)
    second = make_engine(model=copy.deepcopy(base), config=config)
    second.load(tmp_path)
    _train(first, config, steps=1)
    _train(second, config, steps=1)
    for name, tensor in first.export_state_dict().items():
        torch.testing.assert_close(second.export_state_dict()[name], tensor)


def test_lora_trains_only_the_adapter_and_exports_merged_weights(base: torch.nn.Module) -> None:
    from trainer.lora import apply_lora

    config = _config(lora={"rank": 4, "alpha": 8}, optimizer={"lr": 1e-2, "micro_batch_tokens": 64})
    assert config.lora is not None
    frozen = {name: p.clone() for name, p in base.named_parameters()}
    model = apply_lora(copy.deepcopy(base), config=config.lora)
    engine = make_engine(model=model, config=config)
    _train(engine, config)
    exported = engine.export_state_dict()
    assert exported.keys() == frozen.keys()
    assert not torch.equal(exported["model.layers.0.self_attn.q_proj.weight"],
                           frozen["model.layers.0.self_attn.q_proj.weight"])  # the delta is merged in
    torch.testing.assert_close(exported["lm_head.weight"], frozen["lm_head.weight"])  # not a LoRA target
    merged = copy.deepcopy(base)
    merged.load_state_dict(exported)
    batch = [collate(_samples())]
    with_adapter, plain = sequence_logprobs(model, batch), sequence_logprobs(merged, batch)
    for episode_id, values in with_adapter.items():
        torch.testing.assert_close(plain[episode_id], values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("engine_config", [{}, {"deepspeed": {"stage": 3}}], ids=["torch", "zero3"])
def test_a_tied_model_stays_tied_through_every_engine_and_its_checkpoint(
    engine_config: dict[str, object], tmp_path: Path,
) -> None:
    """One matrix trained as both embeddings and head, exported as both (ZeRO-3's gathered export
    included; ZeRO-2 partitions nothing of the model), and still one matrix after a checkpoint round trip."""
    from trainer.tiny_model import TinyModelSpec, make_tiny_model
    from trainer.weight_sync import TIED_HEAD

    tied = make_tiny_model(out_dir=tmp_path / "tied", seed=1, spec=TinyModelSpec(vocab_size=512, tied=True)).path
    config = _config(**engine_config)
    engine = make_engine(model=AutoModelForCausalLM.from_pretrained(tied), config=config)
    before = AutoModelForCausalLM.from_pretrained(tied).lm_head.weight.detach().clone()
    _train(engine, config)
    exported = engine.export_state_dict()
    assert torch.equal(exported[TIED_HEAD], exported["model.embed_tokens.weight"])
    assert not torch.equal(exported[TIED_HEAD], before)  # the head trained, through the embeddings' matrix
    (tmp_path / "checkpoint").mkdir()
    engine.save(tmp_path / "checkpoint")
    again = make_engine(model=AutoModelForCausalLM.from_pretrained(tied), config=config)
    again.load(tmp_path / "checkpoint")
    for name, tensor in exported.items():
        torch.testing.assert_close(again.export_state_dict()[name], tensor)
    assert _train(again, config, steps=1) == pytest.approx(_train(engine, config, steps=1), rel=1e-5)
    for side in (engine, again):
        state = side.export_state_dict()
        assert torch.equal(state[TIED_HEAD], state["model.embed_tokens.weight"])  # still one matrix after a step
