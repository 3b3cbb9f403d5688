"""The trainer's metric and stage names, as `GET /v1/metric-names` serves them."""

from __future__ import annotations

from api.schemas.metric_names import MetricNames
from trainer import cost, metrics


def metric_names() -> MetricNames:
    return MetricNames(names=sorted(metrics.fixed_names()), families=list(metrics.FAMILIES),
                       timing_stages=list(metrics.STAGES), cost_stages=list(cost.STAGES))
