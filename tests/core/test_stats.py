"""core/stats.py: pass@k is the exact probability it names, Wilson's interval its textbook values, and the
task bootstrap's 95 % interval covers the true rate in about 95 % of evaluations (checked on simulated
evaluations of a policy of known skill, with fixed seeds: the test is deterministic)."""

from __future__ import annotations

import itertools
import random

import pytest

from core.stats import Estimate, mean_interval, pass_at_k, task_rate, wilson


@pytest.mark.parametrize(("n", "c"), [(5, 0), (5, 1), (5, 3), (5, 5), (8, 2)])
def test_pass_at_k_is_the_probability_that_one_of_k_draws_succeeds(n: int, c: int) -> None:
    outcomes = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        draws = list(itertools.combinations(outcomes, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_what_is_not_a_count(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=f"got n={n}, c={c}, k={k}"):
        pass_at_k(n, c, k)


def test_wilson_matches_the_textbook_values() -> None:
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    with pytest.raises(ValueError, match="got 3/0"):
        wilson(3, 0)


def test_one_unit_has_no_spread_to_resample() -> None:
    assert mean_interval([0.4]) == Estimate(0.4, 0.4, 0.4, 1)
    with pytest.raises(ValueError, match="got none"):
        task_rate([], 1)


def test_the_same_data_gives_the_same_interval() -> None:
    data = [(4, 1), (4, 3), (4, 0), (4, 4), (4, 2)]
    assert task_rate(data, 1) == task_rate(data, 1)
    assert task_rate(data, 1).value == pytest.approx(10 / 20)
    assert task_rate(data, 4).value == pytest.approx(4 / 5)


def test_the_interval_covers_a_known_skill_about_95_percent_of_the_time() -> None:
    """A policy whose per-task success probability is drawn from Beta(2, 2) (tasks differ in difficulty),
    4 samples on each of 30 tasks; the true pass@1 is the mean of the population (0.5). Over 300 simulated
    evaluations the interval must cover it in 88–99 % of them (a percentile bootstrap with 30 units runs a
    little under its nominal 95 %)."""
    rng = random.Random(1)
    covered = 0
    widths = []
    for trial in range(300):
        per_task = []
        for _ in range(30):
            p = rng.betavariate(2, 2)
            per_task.append((4, sum(rng.random() < p for _ in range(4))))
        estimate = task_rate(per_task, 1, seed=trial)
        covered += estimate.low <= 0.5 <= estimate.high
        widths.append(estimate.high - estimate.low)
    assert 0.88 <= covered / 300 <= 0.99, covered
    assert 0.1 < sorted(widths)[150] < 0.4  # an interval, not the whole line
