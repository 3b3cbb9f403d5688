"""Monitors for learned rewards (issue 15): a judge that pays for length, and a judge that stops agreeing
with the tests, show in the step's metrics (the run page charts every metric per step)."""

from __future__ import annotations

import dataclasses

import pytest

from trainer.metrics import LENGTH_JUDGE_CORR, LENGTH_REWARD_CORR, hacking_metrics, judge_agreement_key
from trainer.rollouts import Sample


def _sample(episode: int, *, tokens: int, reward: float, components: dict[str, float]) -> Sample:
    mask = [0, 0] + [1] * tokens
    return Sample(episode_id=episode, group_id=0, environment="code", status="completed", termination="submitted",
                  reward=reward, components=components, policy_version=0, token_ids=[5] * len(mask), loss_mask=mask,
                  behaviour_logprobs=[-1.0 if m else 0.0 for m in mask])


def test_a_judge_that_pays_for_length_and_ignores_the_tests_is_seen() -> None:
    """The policy learned to write long answers the judge likes; the hidden tests fail on them."""
    gamed = [_sample(i, tokens=10 * (i + 1), reward=0.1 * i, components={"hidden_tests": float(i < 2), "judge": 0.1 * i})
             for i in range(10)]
    metrics = hacking_metrics(gamed)
    assert metrics[LENGTH_REWARD_CORR] == pytest.approx(1.0)
    assert metrics[LENGTH_JUDGE_CORR] == pytest.approx(1.0)
    # judge ≥ 0.5 for i ≥ 5, tests pass for i < 2: agreement only where both fail (i = 2, 3, 4).
    assert metrics[judge_agreement_key("hidden_tests")] == pytest.approx(0.3)


def test_an_honest_judge_agrees_and_length_does_not_pay() -> None:
    lengths = [40, 10, 30, 20, 50, 60, 15, 35]
    honest = [_sample(i, tokens=n, reward=float(i % 2), components={"hidden_tests": float(i % 2), "judge": 0.8 * (i % 2)})
              for i, n in enumerate(lengths)]
    metrics = hacking_metrics(honest)
    assert metrics[judge_agreement_key("hidden_tests")] == 1.0
    assert abs(metrics[LENGTH_REWARD_CORR]) < 0.5


def test_no_judge_no_variance_no_figures() -> None:
    """Nothing is made up: no judge layer, no judge figures; a constant side has no correlation."""
    flat = [_sample(i, tokens=10 + i, reward=1.0, components={"answer": 1.0}) for i in range(5)]
    assert hacking_metrics(flat) == {}
    assert hacking_metrics(flat[:2]) == {}
    varied = [dataclasses.replace(s, reward=float(i)) for i, s in enumerate(flat)]
    assert set(hacking_metrics(varied)) == {LENGTH_REWARD_CORR}
