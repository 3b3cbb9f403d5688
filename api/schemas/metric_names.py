"""The names of the trainer's metrics and stages (`GET /v1/metric-names`), from their one definition in
`trainer.metrics` and `trainer.cost`: the run page reads them here instead of keeping a copy."""

from __future__ import annotations

from pydantic import BaseModel


class MetricNames(BaseModel):
    names: list[str]
    """Every metric name that is fixed (not a template), sorted."""
    families: list[str]
    """The templated names: `{placeholder}` parts take a value (an environment, a reason, a stage …)."""
    timing_stages: list[str]
    """The stages of a step's `timing_s/{stage}`, in the order the step runs them."""
    cost_stages: list[str]
    """The stages of the cost breakdown (`cost/{stage}/seconds`), in the order the run page and `crucible
    run cost` show them."""
