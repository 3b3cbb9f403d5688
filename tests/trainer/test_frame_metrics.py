"""The turn-frame counts of the step's scored episodes (task_workers/episode/loop.py) as step metrics:
means per episode of prefix breaks, unparsed tool calls and turns without a tool call."""

from __future__ import annotations

import pytest

from trainer.metrics import (
    NO_TOOL_CALL_MEAN,
    PREFIX_BREAKS_MEAN,
    UNPARSED_TOOL_CALLS_MEAN,
    is_metric_name,
    step_metrics,
)
from trainer.rollouts import Sample
from trainer.selection import BatchPlan


def _sample(episode_id: int, *, breaks: int, unparsed: int, missing: int) -> Sample:
    return Sample(episode_id=episode_id, group_id=1, environment="code", status="completed", termination="submitted",
                  reward=1.0, components={}, policy_version=0, token_ids=[1, 2], loss_mask=[0, 1],
                  behaviour_logprobs=[0.0, -0.5], turns=4, prefix_breaks=breaks, unparsed_tool_calls=unparsed,
                  turns_without_tool_call=missing)


def test_the_steps_frame_counts_are_means_over_its_scored_episodes() -> None:
    plan = BatchPlan(scored=[_sample(1, breaks=0, unparsed=1, missing=0), _sample(2, breaks=1, unparsed=2, missing=3)])
    metrics = step_metrics(plan=plan, result=None, timings={})
    assert metrics[PREFIX_BREAKS_MEAN] == pytest.approx(0.5)
    assert metrics[UNPARSED_TOOL_CALLS_MEAN] == pytest.approx(1.5)
    assert metrics[NO_TOOL_CALL_MEAN] == pytest.approx(1.5)
    assert all(is_metric_name(name) for name in (PREFIX_BREAKS_MEAN, UNPARSED_TOOL_CALLS_MEAN, NO_TOOL_CALL_MEAN))
