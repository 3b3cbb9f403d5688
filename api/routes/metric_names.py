"""`/v1/metric-names`: the names the trainer writes its step metrics under (trainer.metrics, trainer.cost)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.deps import current_token
from api.schemas.common import ERROR_RESPONSES
from api.schemas.metric_names import MetricNames
from api.services.metric_names import metric_names

router = APIRouter(prefix="/v1/metric-names", tags=["metrics"], dependencies=[Depends(current_token)],
                   responses=ERROR_RESPONSES)


@router.get("", response_model=MetricNames)
def show_metric_names() -> MetricNames:
    """Every fixed metric name, the templated families, the timing stages and the cost stages."""
    return metric_names()
