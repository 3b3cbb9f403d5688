"""Success rates with their uncertainty, for evaluations (`crucible eval`) and learning benchmarks.

An evaluation samples k episodes of each of T tasks. Its episodes are not independent trials: the
samples of one task share its difficulty. So every interval here resamples *tasks* (a percentile
bootstrap over tasks, with a fixed seed: the same data always gives the same interval), never episodes.

- `pass_at_k(n, c, k)`: the unbiased estimator of "at least one of k samples succeeds" from n ≥ k samples
  of which c succeeded (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"):
  1 − C(n−c, k) / C(n, k). pass@1 is c / n.
- `task_rate(per_task, k)`: the mean of pass@k over tasks, with its 95 % bootstrap interval.
- `wilson(successes, trials)`: the Wilson score interval, for independent trials (one sample per task,
  or one measurement per seed).
- `mean_interval(values)`: a mean over independent units (seeds) with its 95 % bootstrap interval.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95 % interval."""
RESAMPLES = 2000
"""Bootstrap resamples: the interval's ends move by well under a point between seeds at this count."""


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    """The 95 % interval; equal to `value` when there is a single unit to resample."""
    units: int
    """What was resampled: tasks (an evaluation) or seeds (a learning benchmark)."""

    def as_dict(self) -> dict[str, float | int]:
        return {"value": self.value, "low": self.low, "high": self.high, "units": self.units}


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from the n is a success), c of n succeeded."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k: expected 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def wilson(successes: int, trials: int, *, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (independent trials)."""
    if not 0 <= successes <= trials or trials == 0:
        raise ValueError(f"wilson: expected 0 ≤ successes ≤ trials and trials > 0, got {successes}/{trials}")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Sequence[float], *, seed: int = 0, resamples: int = RESAMPLES) -> Estimate:
    """The mean of independent units and its 95 % percentile-bootstrap interval."""
    if not values:
        raise ValueError("mean_interval: expected at least one value, got none")
    mean = sum(values) / len(values)
    if len(values) == 1:
        return Estimate(mean, mean, mean, 1)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=len(values))) / len(values) for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]
    return Estimate(mean, min(low, mean), max(high, mean), len(values))


def task_rate(per_task: Sequence[tuple[int, int]], k: int, *, seed: int = 0) -> Estimate:
    """pass@k over tasks, each given as (samples n, successes c) with n ≥ k, and its interval (tasks resampled)."""
    if not per_task:
        raise ValueError("pass@k: expected at least one task, got none")
    return mean_interval([pass_at_k(n, c, k) for n, c in per_task], seed=seed)
