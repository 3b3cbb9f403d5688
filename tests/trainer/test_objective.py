"""The math of a step, on hand-made numbers: rewards → advantages, the token-level objective, packing."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from core.errors import ConfigError
from trainer.advantages import assign_advantages, normalize_per_environment, overlong_penalty, shaped_reward
from trainer.config import LossConfig, TrainerConfig, trainer_config
from trainer.engine import TorchEngine
from trainer.logprobs import sequence_logprobs
from trainer.loss import TokenTensors, k3, policy_loss
from trainer.packing import collate, micro_batches
from trainer.rollouts import Group, Sample
from trainer.step import update


def sample(reward: float, *, env: str = "a", tokens: int = 6, episode: int = 0, mask: list[int] | None = None) -> Sample:
    mask = mask or [0, 0] + [1] * (tokens - 2)
    return Sample(episode_id=episode, group_id=0, environment=env, status="completed", termination="submitted",
                  reward=reward, components={}, policy_version=0, token_ids=[(7 * i + episode) % 50 + 3 for i in
                                                                             range(len(mask))],
                  loss_mask=mask, behaviour_logprobs=[-1.0 if m else 0.0 for m in mask], score=reward)


def test_overlong_shaping_follows_dapo() -> None:
    assert overlong_penalty(100, max_tokens=200, buffer_tokens=50) == 0.0
    assert overlong_penalty(150, max_tokens=200, buffer_tokens=50) == 0.0
    assert overlong_penalty(175, max_tokens=200, buffer_tokens=50) == pytest.approx(-0.5)
    assert overlong_penalty(201, max_tokens=200, buffer_tokens=50) == -1.0
    long = sample(1.0, tokens=12)
    assert shaped_reward(long, loss=LossConfig()) == 1.0
    assert shaped_reward(long, loss=LossConfig(overlong_max_tokens=12, overlong_buffer_tokens=4)) == pytest.approx(0.5)


def test_group_advantages_with_and_without_std_scaling() -> None:
    group = Group(id=1, group_index=0, environment="a", policy_version=0,
                  samples=[sample(r, episode=i) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])])
    assign_advantages([group], scale_by_std=False)
    assert [s.advantage for s in group.samples] == [0.5, -0.5, -0.5, 0.5]
    assign_advantages([group], scale_by_std=True)
    assert [round(s.advantage, 4) for s in group.samples] == [1.0, -1.0, -1.0, 1.0]


def test_normalisation_is_decided_per_run_not_per_batch() -> None:
    """auto means: on for a run that mixes environments, whatever one batch holds (old code decided
    per batch, so a batch that happened to hold one environment was not z-scored)."""
    assert LossConfig().normalization_for(environments=2) == "on"
    assert LossConfig().normalization_for(environments=1) == "off"
    assert LossConfig(normalize_rewards_per_environment="off").normalization_for(environments=3) == "off"
    small = Group(id=1, group_index=0, environment="a", policy_version=0,
                  samples=[sample(r, env="a", episode=i) for i, r in enumerate([0.0, 0.1])])
    assert normalize_per_environment([small], mode="on") == {"a": pytest.approx((0.05, 0.05))}
    assert [s.score for s in small.samples] == pytest.approx([-1.0, 1.0])  # one environment, still z-scored
    with pytest.raises(ValueError, match="resolved per run"):
        normalize_per_environment([small], mode="auto")


def test_rewards_are_normalised_per_environment() -> None:
    small = Group(id=1, group_index=0, environment="a", policy_version=0,
                  samples=[sample(r, env="a", episode=i) for i, r in enumerate([0.0, 0.1])])
    large = Group(id=2, group_index=1, environment="b", policy_version=0,
                  samples=[sample(r, env="b", episode=i) for i, r in enumerate([0.0, 10.0])])
    assert normalize_per_environment([small], mode="off") == {}
    stats = normalize_per_environment([small, large], mode="on")
    assert stats["b"] == (5.0, 5.0)
    assign_advantages([small, large], scale_by_std=False)
    # After the z-score both environments pull equally hard.
    assert [s.advantage for s in small.samples] == pytest.approx([-1.0, 1.0])
    assert [s.advantage for s in large.samples] == pytest.approx([-1.0, 1.0])


def _tokens(logp: list[float], prox: list[float], behav: list[float], adv: float,
            mask: list[float] | None = None) -> TokenTensors:
    mask = mask or [1.0] * len(logp)
    return TokenTensors(logp=torch.tensor([logp], requires_grad=True), prox_logp=torch.tensor([prox]),
                        behav_logp=torch.tensor([behav]), advantages=torch.tensor([[adv] * len(logp)]),
                        mask=torch.tensor([mask]))


def test_loss_clips_high_and_low_and_caps_the_importance_weight() -> None:
    cfg = LossConfig()  # ε_low 0.2, ε_high 0.28, TIS cap 2
    up = math.log(1.5)
    # A>0 and u=1.5 > 1.28: clipped (no gradient); a behaviour logprob far below prox: weight capped at 2.
    tokens = _tokens([up, 0.0], [0.0, 0.0], [-5.0, 0.0], adv=1.0)
    value, stats = policy_loss(tokens, total_tokens=2, loss=cfg)
    assert value.item() == pytest.approx(-(2.0 * 1.28 + 1.0 * 1.0) / 2)
    value.backward()
    assert tokens.logp.grad is not None
    assert tokens.logp.grad[0, 0] == 0.0 and tokens.logp.grad[0, 1] == pytest.approx(-0.5)
    assert stats["clip_high"] == 1 and stats["clip_low"] == 0 and stats["tis_capped"] == 1
    # A<0 and u=0.5 < 0.8: clipped low.
    low = _tokens([math.log(0.5)], [0.0], [0.0], adv=-1.0)
    value, stats = policy_loss(low, total_tokens=1, loss=cfg)
    assert value.item() == pytest.approx(0.8) and stats["clip_low"] == 1


def test_masked_tokens_change_nothing_and_aggregation_is_per_token() -> None:
    cfg = LossConfig()
    a = _tokens([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], adv=1.0, mask=[0.0, 1.0, 1.0])
    b = _tokens([-9.0, -2.0, -3.0], [4.0, -2.0, -3.0], [7.0, -2.0, -3.0], adv=1.0, mask=[0.0, 1.0, 1.0])
    assert policy_loss(a, total_tokens=2, loss=cfg)[0].item() == policy_loss(b, total_tokens=2, loss=cfg)[0].item()
    # DAPO: the step loss is the token sum over the whole batch ÷ its active tokens.
    value, _ = policy_loss(a, total_tokens=10, loss=cfg)
    assert value.item() == pytest.approx(-2 / 10)


def test_k3_kl_term_is_added_with_its_weight() -> None:
    tokens = TokenTensors(logp=torch.tensor([[-1.0]]), prox_logp=torch.tensor([[-1.0]]),
                          behav_logp=torch.tensor([[-1.0]]), advantages=torch.tensor([[0.0]]),
                          mask=torch.tensor([[1.0]]), ref_logp=torch.tensor([[-1.5]]))
    value, stats = policy_loss(tokens, total_tokens=1, loss=LossConfig(kl_beta=0.1))
    expected = float(k3(torch.tensor(-0.5)))
    assert value.item() == pytest.approx(0.1 * expected) and stats["kl_ref"] == pytest.approx(expected)


def test_trainer_config_names_the_bad_field() -> None:
    with pytest.raises(ConfigError, match=r"loss\.clip_low"):
        trainer_config({"loss": {"clip_low": 2}})
    with pytest.raises(ConfigError, match="lora with deepspeed stage 3"):
        trainer_config({"lora": {}, "deepspeed": {"stage": 3}})


def _policy_samples() -> list[Sample]:
    samples = [sample(1.0 if i % 2 else 0.0, tokens=20 + 9 * i, episode=i) for i in range(6)]
    group = Group(id=1, group_index=0, environment="a", policy_version=0, samples=samples)
    assign_advantages([group], scale_by_std=False)
    return samples


def test_micro_batch_split_does_not_change_the_update(tiny_model_dir) -> None:
    """Gradient accumulation over micro-batches gives the weights one big batch gives."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    results = []
    for budget in (4096, 64):
        model = copy.deepcopy(base)
        config = TrainerConfig.model_validate({"optimizer": {"lr": 1e-3, "micro_batch_tokens": budget}})
        engine = TorchEngine(model=model, config=config)
        out = update(engine, _policy_samples(), config=config)
        results.append((model, out))
    (a, out_a), (b, out_b) = results
    assert len(micro_batches(_policy_samples(), max_tokens=64)) > 1
    assert out_a.loss == pytest.approx(out_b.loss, rel=1e-5)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-6)


def test_positive_advantage_raises_the_sampled_tokens_logprob(tiny_model_dir) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples = _policy_samples()
    batch = [collate(samples)]
    before = sequence_logprobs(model, batch)
    config = TrainerConfig.model_validate({"optimizer": {"lr": 3e-3}})
    update(TorchEngine(model=model, config=config), samples, config=config)
    after = sequence_logprobs(model, batch)
    for s in samples:
        delta = float((after[s.episode_id] - before[s.episode_id]).sum())
        assert delta > 0 if s.advantage > 0 else delta < 0


@pytest.mark.parametrize("epochs", [1, 2])
def test_bf16_autocast_does_the_float32_update_to_bf16_rounding(tiny_model_dir, epochs: int) -> None:
    """`optimizer.autocast: bf16` runs the forward (and so the backward) in bf16 — weights, gradients
    and optimizer state stay float32 — and moves the weights as the float32 update does, to bf16's
    precision; with two epochs the proximal pass runs under the same autocast (u = 1 at the start)."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    results = []
    for autocast in ("off", "bf16"):
        model = copy.deepcopy(base)
        config = TrainerConfig.model_validate({"optimizer": {"lr": 1e-3, "autocast": autocast, "epochs": epochs}})
        out = update(TorchEngine(model=model, config=config), _policy_samples(), config=config)
        results.append((model, out))
    (full, out_full), (half, out_half) = results
    assert all(p.dtype == torch.float32 for p in half.parameters())
    assert out_half.loss != out_full.loss  # bf16 did run: its rounding shows in the loss
    assert out_half.loss == pytest.approx(out_full.loss, abs=2e-3)
    assert out_half.grad_norms[0] == pytest.approx(out_full.grad_norms[0], rel=0.05)
    # The same step, not another one: Adam's first step is about lr·sign(gradient), so compare the
    # directions the weights moved in (a coordinate whose gradient is ~0 may flip sign under bf16).
    def delta(model: torch.nn.Module) -> torch.Tensor:
        return torch.cat([(p - q).flatten() for p, q in zip(model.parameters(), base.parameters(), strict=True)])

    moved_full, moved_half = delta(full), delta(half)
    assert float(moved_full.abs().max()) > 1e-4
    assert float(torch.nn.functional.cosine_similarity(moved_full, moved_half, dim=0)) > 0.9
    if epochs == 2:  # the clip statistic would show π_θ/π_prox ≠ 1 from a prox pass in another precision
        assert out_half.stats.get("clip_frac", 0.0) == pytest.approx(out_full.stats.get("clip_frac", 0.0), abs=0.05)


def test_an_unknown_autocast_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"optimizer\.autocast"):
        trainer_config({"optimizer": {"autocast": "fp8"}})
