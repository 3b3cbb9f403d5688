"""The holes an RL review of the trainer found (issue 23), each a test that failed before its fix:
the flag penalty under `mix: zscore`, the online pass-rate rule, the KL value cap, π_prox with
dropout on. (The unverified label: tests/task_workers/episode/test_version_labels.py; misaligned
samples: tests/trainer/test_async_staleness.py; ZeRO-2 across ranks: tests/trainer/test_ranks.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sqlalchemy.orm import Session
from transformers import AutoModelForCausalLM

from core.schemas.run import SuccessRule
from environments.rewards import FlagPolicy
from tests.trainer.rows import make_environment
from trainer import step as step_module
from trainer.advantages import assign_advantages, mix_layers
from trainer.config import LoraConfig, TrainerConfig
from trainer.engine import TorchEngine
from trainer.lora import apply_lora
from trainer.loss import K3_MAX, k3
from trainer.rollouts import Group, Sample
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
    judged.pass_rate, judged.pass_rate_rule = 0.5, SuccessRule(threshold=0.7).model_dump()
    _, tests_layer = make_environment(db_session)
    tests_layer.pass_rate, tests_layer.pass_rate_rule = 0.5, {"threshold": 1.0, "component": "hidden_tests"}
    db_session.flush()
    outcomes = [PassOutcome(judged.id, 0.8, {}, 1)] * 4 + [PassOutcome(tests_layer.id, 0.4, {"hidden_tests": 1.0}, 1)] * 4
    rates = update_pass_rates(db_session, weight=0.5, outcomes=outcomes)
    assert rates == {judged.id: pytest.approx(0.75), tests_layer.id: pytest.approx(0.75)}
    # An unmeasured task follows the run's own rule (curriculum.success).
    _, fresh = make_environment(db_session)
    db_session.flush()
    assert update_pass_rates(db_session, weight=0.5, rule=SuccessRule(threshold=0.5),
                             outcomes=[PassOutcome(fresh.id, 0.6, {}, 1)]) == {fresh.id: 1.0}


def test_a_flagged_episode_never_passes_whatever_its_component_scored(db_session: Session) -> None:
    """Issue 47, item 9: under a component rule (`hidden_tests`), a hacked episode whose tests layer scored 1
    but which carries a flag used to count as a pass, so the task left the band and its penalty stopped."""
    rule = SuccessRule(component="hidden_tests")
    assert rule.passed(0.0, {"hidden_tests": 1.0}) and not rule.passed(0.0, {"hidden_tests": 1.0}, ("result_forging",))
    assert not SuccessRule(threshold=0.5).passed(1.0, {}, ("tests_deleted",))
    _, task = make_environment(db_session)
    task.pass_rate, task.pass_rate_rule = 0.5, rule.model_dump()
    db_session.flush()
    hacked = PassOutcome(task.id, 0.0, {"hidden_tests": 1.0}, 1, flags=("result_forging",))
    assert update_pass_rates(db_session, weight=1.0, outcomes=[hacked] * 4) == {task.id: 0.0}


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
