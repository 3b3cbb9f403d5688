"""The holes an RL review of the trainer found (issue 23), each a test that failed before its fix:
the flag penalty under `mix: zscore`, the online pass-rate rule, the KL value cap, π_prox with
dropout on. (Labels: tests/task_workers/episode/test_offpolicy_episode.py; misaligned
samples: tests/trainer/test_async_staleness.py; ZeRO-2 across ranks: tests/trainer/test_ranks.py.)"""

from __future__ import annotations

import logging
import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session
from transformers import AutoModelForCausalLM

from core.errors import ConfigError
from core.models import Episode
from core.schemas.run import Curriculum, SuccessRule
from core.termination import DropReason
from environments.rewards import ZERO_VARIANCE_SPREAD, FlagPolicy
from tests.factories import add_group, make_environment, make_run, synthetic_turns
from trainer import metrics
from trainer import step as step_module
from trainer.advantages import assign_advantages, mix_layers, normalize_per_environment
from trainer.config import LoraConfig, LossConfig, TrainerConfig
from trainer.engine import TorchEngine
from trainer.logprobs import decoder_and_head, sequence_logprobs
from trainer.loop import Trainer
from trainer.lora import apply_lora
from trainer.loss import K3_MAX, TokenTensors, k3, policy_loss
from trainer.packing import collate
from trainer.probe import DEFAULT_TOLERANCE, probe_tolerance
from trainer.rollouts import ENVIRONMENT, Group, Sample
from trainer.selection import StalenessRule, plan_batch
from trainer.store import PassOutcome, update_pass_rates


def _sample(episode_id: int, *, layers: dict[str, float], flags: tuple[str, ...] = (), reward: float = 0.0) -> Sample:
    return Sample(episode_id=episode_id, group_id=0, environment="code", status="completed", termination="submitted",
                  reward=reward, components=layers, policy_version=0, token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                  behaviour_logprobs=[0.0, -1.0, -1.0], flags=flags, score=reward)


@pytest.mark.parametrize("policy", ["penalize", "zero"])
def test_a_flag_still_costs_under_zscore_mixing(policy: str) -> None:
    """Two samples with equal layers, one flagged: the flagged one must get the lower advantage (before
    the fix, the score was rebuilt from the layers alone and both got the same)."""
    layers = {"hidden_tests": 1.0, "judge": 0.8}
    penalty = 1.0
    honest = _sample(1, layers=layers, reward=1.8)
    flagged = _sample(2, layers=layers, flags=("forged_exit",), reward=1.8 - penalty if policy == "penalize" else 0.0)
    failing = _sample(3, layers={"hidden_tests": 0.0, "judge": 0.2}, reward=0.2)
    group = Group(id=0, group_index=0, environment="code", policy_version=0, samples=[honest, flagged, failing],
                  mix={"hidden_tests": 0.5, "judge": 0.5}, flag_policy=FlagPolicy(policy, penalty))
    mix_layers([group])
    assign_advantages([group], scale_by_std=False)
    assert flagged.advantage < honest.advantage
    if policy == "zero":
        assert flagged.advantage < failing.advantage  # zero: it earned nothing on any layer


def test_the_online_pass_rate_counts_passes_by_the_rule_the_task_was_measured_with(db_session: Session) -> None:
    """A judge-scored task (rewards in [0, 1], a pass at ≥ 0.7) must not drift to rate 0 because no reward
    reaches 1.0: the trainer's update follows the pass-rate job's rule, recorded on the task."""
    _, judged = make_environment(db_session)
    judged.pass_rate, judged.pass_rate_samples = 0.5, 4
    judged.pass_rate_rule = SuccessRule(threshold=0.7).model_dump()
    _, tests_layer = make_environment(db_session)
    tests_layer.pass_rate, tests_layer.pass_rate_samples = 0.5, 4
    tests_layer.pass_rate_rule = {"threshold": 1.0, "component": "hidden_tests"}
    run = make_run(db_session, model="unused")
    db_session.flush()
    outcomes = [PassOutcome(judged.id, 0.8, {}, 1)] * 4 + [PassOutcome(tests_layer.id, 0.4, {"hidden_tests": 1.0}, 1)] * 4
    rates = update_pass_rates(db_session, run_id=run.id, curriculum=Curriculum(pass_rate_update=0.5), outcomes=outcomes)
    # 2 passes of 4 measured, halved, then 4 of 4: (1 + 4) / (2 + 4)
    assert rates == {judged.id: pytest.approx(5 / 6), tests_layer.id: pytest.approx(5 / 6)}
    # An unmeasured task follows the run's own rule (curriculum.success).
    _, fresh = make_environment(db_session)
    db_session.flush()
    assert update_pass_rates(db_session, run_id=run.id, outcomes=[PassOutcome(fresh.id, 0.6, {}, 1)],
                             curriculum=Curriculum(pass_rate_update=0.5, success=SuccessRule(threshold=0.5))
                             ) == {fresh.id: 1.0}


def test_a_flagged_episode_never_passes_whatever_its_component_scored(db_session: Session) -> None:
    """Issue 47, item 9: under a component rule (`hidden_tests`), a hacked episode whose tests layer scored 1
    but which carries a flag used to count as a pass, so the task left the band and its penalty stopped."""
    rule = SuccessRule(component="hidden_tests")
    assert rule.passed(0.0, {"hidden_tests": 1.0}) and not rule.passed(0.0, {"hidden_tests": 1.0}, ("result_forging",))
    assert not SuccessRule(threshold=0.5).passed(1.0, {}, ("tests_deleted",))
    _, task = make_environment(db_session)
    task.pass_rate, task.pass_rate_samples, task.pass_rate_rule = 0.5, 4, rule.model_dump()
    run = make_run(db_session, model="unused")
    db_session.flush()
    hacked = PassOutcome(task.id, 0.0, {"hidden_tests": 1.0}, 1, flags=("result_forging",))
    assert update_pass_rates(db_session, run_id=run.id, curriculum=Curriculum(pass_rate_update=1.0),
                             outcomes=[hacked] * 4) == {task.id: 0.0}


def test_the_kl_term_caps_its_value_not_only_its_log_ratio() -> None:
    """k3 = e^d − d − 1 reaches 4.9e8 at d = 20: one token far from π_ref would swamp the loss."""
    values = k3(torch.tensor([0.0, 1.0, 15.0, 40.0, -40.0]))
    assert values[0] == 0 and values[1] == pytest.approx(torch.e - 2) and values.max() <= K3_MAX
    d = torch.tensor([15.0], requires_grad=True)
    k3(d).sum().backward()
    assert d.grad is not None and d.grad.item() == 0.0  # past the cap: no gradient


def test_with_dropout_on_the_proximal_logprobs_come_from_the_weights_in_eval_mode(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With LoRA dropout, a training forward is noisy: π_prox must be the weights' own logprobs (eval
    mode), recomputed even for a single pass (before the fix it was the noisy forward, detached)."""
    config = TrainerConfig.model_validate({"lora": LoraConfig(rank=2, alpha=4, dropout=0.3).model_dump()})
    model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config=config.lora)  # type: ignore[arg-type]
    engine = TorchEngine(model=model, config=config)
    modes: list[bool] = []
    real = step_module.sequence_logprobs

    def spy(model: torch.nn.Module, *args, **kwargs):  # type: ignore[no-untyped-def]
        modes.append(model.training)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(step_module, "sequence_logprobs", spy)
    sample = Sample(episode_id=1, group_id=0, environment="e", status="completed", termination="submitted",
                    reward=1.0, components={}, policy_version=0, token_ids=[5, 6, 7, 8, 9],
                    loss_mask=[0, 0, 1, 1, 1], behaviour_logprobs=[0.0, 0.0, -6.0, -6.0, -6.0], advantage=1.0)
    step_module.update(engine, [sample], config=config)
    assert modes == [False] and model.training  # computed in eval mode, training resumed after
    assert not step_module.has_dropout(AutoModelForCausalLM.from_pretrained(tiny_model_dir))


# -- Issue 47, item 10: the review's low items (L1–L4, L5, L7, L8, L11) and the foreign version of H2 --------

def _row(episode_id: int, *, reward: float, versions: list[int], behaviour: float = -6.0) -> Sample:
    """One turn: 3 environment tokens, then one sampled token per entry of `versions`."""
    sampled = len(versions)
    return Sample(episode_id=episode_id, group_id=0, environment="e", status="completed", termination="submitted",
                  reward=reward, components={}, policy_version=min(versions),
                  token_ids=[(5 * i + episode_id) % 40 + 5 for i in range(3 + sampled)],
                  loss_mask=[0, 0, 0] + [1] * sampled, behaviour_logprobs=[0.0, 0.0, 0.0] + [behaviour] * sampled,
                  token_versions=[ENVIRONMENT] * 3 + versions, score=reward)


def test_under_bf16_autocast_the_lm_head_runs_in_float32(tiny_model_dir: Path) -> None:
    """L1: under `autocast: bf16` the head ran in bf16 and rounded the logits before the float32
    log-softmax (the review's e4: twice the k3 mismatch against float32 behaviour logprobs). The decoder
    may run in bf16; the head's matmul, its input and its logits are float32."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    _, head = decoder_and_head(model)
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    head.register_forward_hook(lambda module, inputs, output: seen.append((inputs[0].dtype, output.dtype)))
    config = TrainerConfig.model_validate({"optimizer": {"autocast": "bf16"}})
    rows = [_row(1, reward=1.0, versions=[0, 0, 0]), _row(2, reward=0.0, versions=[0, 0, 0])]
    assign_advantages([Group(id=0, group_index=0, environment="e", policy_version=0, samples=rows)], scale_by_std=False)
    step_module.update(TorchEngine(model=model, config=config), rows, config=config)
    assert seen and set(seen) == {(torch.float32, torch.float32)}


def test_the_mismatch_over_lag_0_tokens_is_reported_apart_from_the_stale_ones(tiny_model_dir: Path) -> None:
    """L2: `mismatch/kl` is taken over every weighted token, lags up to 2η included, so a numerical
    mismatch (bf16, kernels) cannot be told from policy drift. `mismatch/kl_lag0` takes the lag-0 tokens
    alone: the same figure when every token is fresh, the fresh tokens' own when a stale sample joins."""
    rule, loss = StalenessRule.for_bound(1), LossConfig()

    def step(rows: list[Sample]) -> dict[str, float]:
        group = Group(id=0, group_index=0, environment="e", policy_version=0, samples=rows)
        plan = plan_batch([group], current_version=1, rule=rule, batch_size=1, loss=loss)
        assign_advantages(plan.groups, scale_by_std=False)
        engine = TorchEngine(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), config=TrainerConfig())
        return metrics.update_metrics(step_module.update(engine, plan.samples, config=TrainerConfig()))

    fresh = step([_row(1, reward=1.0, versions=[1, 1, 1]), _row(2, reward=0.0, versions=[1, 1, 1])])
    assert fresh[metrics.MISMATCH_KL_LAG0] == pytest.approx(fresh[metrics.MISMATCH_KL])
    alone = _row(1, reward=1.0, versions=[1, 1, 1])
    mixed = step([alone, _row(2, reward=0.0, versions=[0, 0, 0], behaviour=-1.0)])  # every token of lag 1
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prox = sequence_logprobs(model, [collate([alone])])[1]  # (T−1,) π_prox of the fresh sample alone
    expected = float(k3(prox[2:] - torch.tensor(alone.behaviour_logprobs[3:])).mean())
    assert mixed[metrics.MISMATCH_KL_LAG0] == pytest.approx(expected, rel=1e-4)
    assert mixed[metrics.MISMATCH_KL] != pytest.approx(expected, rel=1e-2)  # the stale tokens moved the other


def test_the_k3_term_as_a_loss_follows_the_gradient_of_the_forward_kl() -> None:
    """L3: k3 with d = log π_ref − log π_θ on tokens drawn from π_θ estimates KL(π_θ ‖ π_ref) in value, but
    its expected gradient is ∇ KL(π_ref ‖ π_θ), the forward KL (Tang & Munos 2025) — what loss.py and the
    docs now say (they said reverse). Exact expectation over a 3-token softmax. (The code did not change:
    this pins the direction the comment states.)"""
    logits = torch.tensor([0.3, -1.2, 0.9], requires_grad=True)
    ref = torch.log_softmax(torch.tensor([1.0, 0.0, -0.5]), dim=-1)
    logp = torch.log_softmax(logits, dim=-1)
    (torch.exp(logp).detach() * k3(ref - logp)).sum().backward()  # E_{x∼π_θ}[k3], π_θ(x) not differentiated
    assert logits.grad is not None
    k3_grad = logits.grad.clone()
    forward = torch.autograd.grad((torch.exp(ref) * (ref - torch.log_softmax(logits, dim=-1))).sum(), logits)[0]
    own = torch.log_softmax(logits, dim=-1)
    reverse = torch.autograd.grad((torch.exp(own) * (own - ref)).sum(), logits)[0]
    assert torch.allclose(k3_grad, forward, atol=1e-6) and not torch.allclose(k3_grad, reverse, atol=1e-2)


def _one_token(*, ratio: float, advantage: float) -> TokenTensors:
    return TokenTensors(logp=torch.tensor([[math.log(ratio)]], requires_grad=True), prox_logp=torch.tensor([[0.0]]),
                        behav_logp=torch.tensor([[0.0]]), advantages=torch.tensor([[advantage]]),
                        mask=torch.tensor([[1.0]]))


def test_the_dual_clip_bounds_the_loss_of_a_negative_advantage() -> None:
    """L4: with several passes u = π_θ/π_prox leaves 1, and for A < 0 the PPO objective min(uA, clip(u)A)
    is unbounded in u: u = 10, A = −1 cost 10. The dual clip (Ye et al. 2020; verl's c = 3) bounds it
    by c·A, on by default; `dual_clip: null` turns it off."""
    tokens = _one_token(ratio=10.0, advantage=-1.0)
    value, stats = policy_loss(tokens, total_tokens=1, loss=LossConfig())
    value.backward()
    assert LossConfig().dual_clip == 3.0
    assert float(value.detach()) == pytest.approx(3.0) and stats["clip_dual"] == 1.0
    assert tokens.logp.grad is not None and float(tokens.logp.grad) == 0.0  # bounded: no gradient through it
    unbounded, _ = policy_loss(_one_token(ratio=10.0, advantage=-1.0), total_tokens=1, loss=LossConfig(dual_clip=None))
    assert float(unbounded.detach()) == pytest.approx(10.0)
    for ratio, advantage, expected in [(2.0, -1.0, 2.0), (10.0, 1.0, -1.28), (0.5, -1.0, 0.8)]:  # below c, or A > 0
        value, stats = policy_loss(_one_token(ratio=ratio, advantage=advantage), total_tokens=1, loss=LossConfig())
        assert float(value.detach()) == pytest.approx(expected) and stats["clip_dual"] == 0.0
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(dual_clip=1.0)


def test_a_reward_spread_of_numerical_noise_is_no_variance_anywhere() -> None:
    """L5: std scaling divided by std + 1e-6, and 1e-6 was also the zero-variance spread: a group
    [0.5, 0.500002] passed the variance check and got advantages ±0.5. A spread up to
    ZERO_VARIANCE_SPREAD is no variance for the group check, the advantages and both z-scores alike."""
    noisy = [_row(1, reward=0.5, versions=[0]), _row(2, reward=0.500002, versions=[0])]
    group = Group(id=7, group_index=0, environment="e", policy_version=0, samples=noisy)
    plan = plan_batch([group], current_version=0, rule=StalenessRule.for_bound(1), batch_size=1, loss=LossConfig())
    assert plan.dropped == {7: DropReason.ZERO_VARIANCE}
    assign_advantages([group], scale_by_std=True)
    assert all(abs(sample.advantage) < 0.1 for sample in noisy)
    normalize_per_environment([group], mode="on")
    assert [sample.score for sample in noisy] == [0.0, 0.0]
    clear = [_row(1, reward=0.5, versions=[0]), _row(2, reward=0.5 + 2 * ZERO_VARIANCE_SPREAD, versions=[0])]
    assign_advantages([Group(id=8, group_index=0, environment="e", policy_version=0, samples=clear)], scale_by_std=True)
    assert [sample.advantage for sample in clear] == pytest.approx([-1.0, 1.0])
    assert ZERO_VARIANCE_SPREAD >= 1e-5  # well above fp32 noise on rewards of order 1


def _draws() -> tuple[list[float], float, float]:
    return torch.rand(4).tolist(), random.random(), float(numpy.random.random())


def test_a_resumed_trainer_draws_the_random_numbers_an_uninterrupted_one_draws(
    db_session: Session, tiny_model_dir: Path, tokenizer, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """L7: the checkpoint held no RNG state, so with LoRA dropout a resumed run differed from an
    uninterrupted one. One real step (its dropout draws from torch's generator), then the trainer draws
    on; a new trainer resumed from that step's checkpoint draws the same numbers (torch, Python, numpy).
    Publishing to vLLM is left out: no publisher, `_publish` a no-op (tests/trainer/test_training.py
    resumes against the real server)."""
    run = make_run(db_session, model=str(tiny_model_dir), group_size=2, batch_size=1,
                   trainer={"lora": {"rank": 2, "alpha": 4, "dropout": 0.3}})
    env, task = make_environment(db_session)
    add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], vocab=len(tokenizer))
    db_session.commit()
    first = Trainer(run_id=run.id, publisher=SimpleNamespace(replicas=[]), checkpoint_root=tmp_path / "ck")  # type: ignore[arg-type]
    try:
        random.random(), numpy.random.random()  # the process's other generators move too (a shuffle, a sampler)
        plan = step_module.generate(db_session, run_id=run.id, version=0, rule=StalenessRule.for_bound(1),
                                    batch_size=1, loss=first.config.loss)
        first._commit(db_session, plan, first._learn(plan, {}), {})
        first.checkpoints.promote(1)
        uninterrupted = _draws()
    finally:
        first._lock.release()
    resumed = Trainer(run_id=run.id, publisher=SimpleNamespace(replicas=[]), checkpoint_root=tmp_path / "ck")  # type: ignore[arg-type]
    try:
        resumed._publish = lambda **_: None  # type: ignore[method-assign]
        resumed.resume()
        assert resumed.step == 1 and _draws() == uninterrupted
    finally:
        resumed._lock.release()


def test_a_malformed_sample_is_left_out_and_its_group_trains_on_the_rest(
    db_session: Session, caplog: pytest.LogCaptureFixture,
) -> None:
    """L8: one episode whose stored arrays do not line up raised MalformedSample out of the trainer, and
    the group, still complete, was claimed first again on every restart. It is left out (`malformed`,
    logged with the episode), and the group trains on its other samples. (The database refuses turns whose
    token arrays differ in length; version runs of the wrong length are what it can hold.)"""
    run = make_run(db_session, model="unused", group_size=3, batch_size=1)
    env, task = make_environment(db_session)
    rng = random.Random(0)
    turns = [synthetic_turns(rng, vocab=100) for _ in range(3)]
    completion = len(turns[1][0]["token_ids"]) - turns[1][0]["prompt_length"]
    turns[1][0]["version_runs"] = [0, completion + 1]  # versions for one token more than it sampled
    group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 1.0, 0.0], turns=turns)
    db_session.commit()
    with caplog.at_level(logging.WARNING, logger="trainer.rollouts"):
        plan = step_module.generate(db_session, run_id=run.id, version=0, rule=StalenessRule.for_bound(1),
                                    batch_size=1, loss=LossConfig())
    assert plan.left_out == {"malformed": 1} and [g.id for g in plan.groups] == [group.id]
    assert [sample.score for sample in plan.samples] == [1.0, 0.0]
    [bad] = [e.id for e in db_session.execute(select(Episode).where(
        Episode.group_id == group.id, Episode.sample_index == 1)).scalars()]
    assert f"episode {bad}" in caplog.text and "left out" in caplog.text


def test_a_token_sampled_by_a_version_newer_than_the_trained_one_never_trains() -> None:
    """H2 (its trainer half): a token labelled with a version ahead of the one being trained (another
    run's weights under a bare label) has a negative lag, passed the mask and the cap and trained at
    full weight. Its sample is left out as `foreign_version` and stays out of the group's baseline."""
    own = [_row(1, reward=1.0, versions=[2, 2]), _row(2, reward=0.0, versions=[1, 2])]
    foreign = _row(3, reward=1.0, versions=[2, 7])
    group = Group(id=5, group_index=0, environment="e", policy_version=1, samples=[*own, foreign])
    plan = plan_batch([group], current_version=2, rule=StalenessRule.for_bound(1), batch_size=1, loss=LossConfig())
    assert plan.left_out == {"foreign_version": 1}
    assert [sample.episode_id for sample in plan.samples] == [1, 2] and foreign not in plan.scored
    assign_advantages(plan.groups, scale_by_std=False)
    assert [sample.advantage for sample in plan.samples] == [0.5, -0.5]  # the baseline of the run's own samples
    alone = Group(id=6, group_index=1, environment="e", policy_version=1,
                  samples=[_row(4, reward=1.0, versions=[3]), _row(5, reward=0.0, versions=[4])])
    plan = plan_batch([alone], current_version=2, rule=StalenessRule.for_bound(1), batch_size=1, loss=LossConfig())
    assert plan.dropped == {6: DropReason.NO_TRAINABLE_SAMPLE} and plan.left_out == {"foreign_version": 2}


def test_the_probe_tolerance_follows_the_served_dtype() -> None:
    """L11: one tolerance (1e-3) for every dtype failed every sync with a bf16 vLLM (it measures about 3e-3),
    and the only remedy loosened the check for float32 too. The tolerance is the served dtype's."""
    assert probe_tolerance("float32") == probe_tolerance(torch.float32) == DEFAULT_TOLERANCE == 1e-3
    assert probe_tolerance("bfloat16") == probe_tolerance(torch.bfloat16) > 3e-3  # what bf16 vLLM measures
    assert probe_tolerance("float32") < probe_tolerance("half") == probe_tolerance("float16") < probe_tolerance("bfloat16")
    with pytest.raises(ConfigError, match=r"expected float32, bfloat16 or float16.*got 'auto'"):
        probe_tolerance("auto")
