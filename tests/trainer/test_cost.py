"""Every training step records its cost (trainer/cost.py): time and tokens of rollout, actor update,
reference forward and reward, FLOPs 6·N_active·tokens, achieved FLOP/s, MFU where the peak is known.

The step is the real trainer's on the real tiny model (tests/trainer/cost_steps.py); what it records
is checked against what the test counts itself from the database (turn tokens, episode timings) and
the model's own parameters — never against the trainer's numbers."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from core.errors import ConfigError
from core.models import Episode, EpisodeGroup, Turn
from core.settings import get_settings
from tests.trainer.cost_steps import train_steps
from trainer import cost
from trainer.rollouts import Sample


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """CRUCIBLE_PEAK_FLOPS is a setting: read afresh in each test, and not left cached for the next."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _counted(session: Session, *, run_id: int, step: int) -> dict[str, float]:
    """Tokens and timings of the episodes the step trained on, read from the store."""
    episodes = session.execute(select(Episode).join(EpisodeGroup, EpisodeGroup.id == Episode.group_id).where(
        EpisodeGroup.run_id == run_id, EpisodeGroup.consumed_step == step)).scalars().all()
    ids = [e.id for e in episodes]
    turns = session.execute(select(Turn.token_ids, Turn.loss_mask).where(Turn.episode_id.in_(ids))).all()
    return {"episodes": len(ids), "tokens": sum(len(t.token_ids) for t in turns),
            "sampled": sum(sum(t.loss_mask) for t in turns),
            "rollout_s": sum(e.timings["total"] - e.timings["verify"] for e in episodes),
            "generation_s": sum(e.timings["generation"] for e in episodes),
            "verify_s": sum(e.timings["verify"] for e in episodes)}


def test_each_step_records_counted_tokens_episode_times_and_flops(
    db_session: Session, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CRUCIBLE_PEAK_FLOPS", raising=False)
    run_id, rows = train_steps(db_session, model_dir=tiny_model_dir, tmp_path=tmp_path, steps=2, kl_beta=0.1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    # Untied tiny model: N_active is every parameter but the input embedding table.
    n_active = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    assert [row.step for row in rows] == [1, 2]
    for row in rows:
        m, counted = row.metrics, _counted(db_session, run_id=run_id, step=row.step)
        assert counted["episodes"] == 2
        assert m[cost.UPDATE_TOKENS] == counted["tokens"]  # one epoch: each token once through the actor
        assert m[cost.REFERENCE_TOKENS] == counted["tokens"]  # β > 0: the reference scored the same batch
        assert m[cost.ROLLOUT_TOKENS] == counted["tokens"] and m[cost.ROLLOUT_SAMPLED] == counted["sampled"]
        assert m[cost.ROLLOUT_S] == pytest.approx(counted["rollout_s"], abs=1e-5)
        assert m[cost.ROLLOUT_GEN_S] == pytest.approx(counted["generation_s"], abs=1e-5)
        assert m[cost.REWARD_S] == pytest.approx(counted["verify_s"], abs=1e-5)
        assert m[cost.REWARD_EPISODES] == counted["episodes"]
        assert m[cost.PARAMS] == n_active
        assert m[cost.FLOPS] == pytest.approx(6 * n_active * counted["tokens"] + 2 * n_active * counted["tokens"])
        assert m[cost.REFERENCE_S] > 0 and m[cost.UPDATE_S] > 0  # both ran (hooks saw the reference forward)
        compute_s = m[cost.UPDATE_S] + m[cost.REFERENCE_S]
        assert m[cost.FLOPS_PER_S] == pytest.approx(m[cost.FLOPS] / compute_s, rel=1e-3)
        assert m[cost.MFU] is None  # CPU: no known peak
        assert m[cost.STEP_S] >= m[cost.UPDATE_S]


def test_without_a_kl_term_no_reference_forward_is_counted(
    db_session: Session, tiny_model_dir: Path, tmp_path: Path,
) -> None:
    _, [row] = train_steps(db_session, model_dir=tiny_model_dir, tmp_path=tmp_path, steps=1, kl_beta=0.0)
    assert row.metrics[cost.REFERENCE_TOKENS] == 0 and row.metrics[cost.REFERENCE_S] == 0
    assert row.metrics[cost.FLOPS] == 6 * row.metrics[cost.PARAMS] * row.metrics[cost.UPDATE_TOKENS]


def test_mfu_is_reported_against_a_known_peak(
    db_session: Session, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRUCIBLE_PEAK_FLOPS", "2e11")
    _, [row] = train_steps(db_session, model_dir=tiny_model_dir, tmp_path=tmp_path, steps=1)
    # Metrics are stored to 6 decimals: on a slow (loaded) machine the MFU is ~1e-4 and that rounding alone
    # is a relative 1e-2, so the bound is the rounding's, not a relative one.
    assert row.metrics[cost.MFU] == pytest.approx(row.metrics[cost.FLOPS_PER_S] / 2e11, rel=1e-3, abs=1e-6)
    assert row.metrics[cost.MFU] > 0


@pytest.mark.parametrize("value", ["fast", "0", "-1e12", "nan"])
def test_a_bad_peak_override_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CRUCIBLE_PEAK_FLOPS", value)
    with pytest.raises(ConfigError, match=f"CRUCIBLE_PEAK_FLOPS: .*, got '{value}'"):
        cost.peak_flops("cpu")


def test_cpu_has_no_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRUCIBLE_PEAK_FLOPS", raising=False)
    assert cost.peak_flops("cpu") is None


@pytest.mark.parametrize("tied", [True, False])
def test_active_parameters_leave_out_only_an_untied_input_table(tied: bool) -> None:
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())  # a tied table is counted once by parameters()
    expected = total if tied else total - 64 * 32
    assert cost.active_parameters(model) == expected


def test_episodes_without_timings_cost_nothing_rather_than_crash() -> None:
    """Episodes recorded before timings existed, or with a null timings field, or a non-number."""
    samples = [Sample(episode_id=i, group_id=0, environment="e", status="completed", termination="submitted",
                      reward=0.0, components={}, policy_version=0, token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                      behaviour_logprobs=[0.0, -1.0, -1.0]) for i in range(3)]
    values = cost.step_cost(samples=samples, timings={0: {}, 1: {"total": None, "verify": "3"}, 2: None},
                            update_seconds=0.0, update_tokens=9, reference_seconds=0.0, reference_tokens=0,
                            step_seconds=0.0, params_active=10, peak=None)
    assert values[cost.ROLLOUT_S] == 0 and values[cost.REWARD_S] == 0
    assert values[cost.FLOPS_PER_S] is None and values[cost.MFU] is None  # no time measured: no rate
    assert values[cost.ROLLOUT_TOKENS] == 9 and values[cost.ROLLOUT_SAMPLED] == 6


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"step_seconds": [1.0], "target_steps": 0}, "target steps: expected a positive integer, got 0"),
    ({"step_seconds": [1.0], "target_steps": 10, "gpus": 0}, "gpus: expected a positive integer, got 0"),
    ({"step_seconds": [], "target_steps": 10}, "expected at least one recorded step"),
])
def test_gpu_hours_refuses_worst_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cost.gpu_hours(**kwargs)


def test_gpu_hours_uses_the_median_step_not_the_mean() -> None:
    # One slow outlier step (a checkpoint, a compile) must not inflate the projection.
    hours = cost.gpu_hours(step_seconds=[10.0, 12.0, 600.0], target_steps=300, gpus=8)
    assert math.isclose(hours, 300 * 12.0 * 8 / 3600)


def test_the_reference_timer_counts_tokens_and_lets_go() -> None:
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1)
    model = Qwen2ForCausalLM(config).eval()
    timer = cost.ForwardTimer(model)
    ids = torch.randint(0, 64, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        model.model(input_ids=ids, attention_mask=mask)
    seconds, tokens = timer.take()
    assert tokens == 8 and seconds > 0
    assert timer.take() == (0.0, 0)
    timer.close()
    with torch.no_grad():
        model.model(input_ids=ids, attention_mask=mask)
    assert timer.take() == (0.0, 0)  # closed: the hooks are gone
