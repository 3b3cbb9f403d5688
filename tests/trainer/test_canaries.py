"""A canary group is measured, never trained on (trainer/selection.py, trainer/metrics.py): it is dropped
with the reason `canary`, and the step reports how many canary episodes it saw, their mean score on the
layer no honest change passes, and how many scored above 0."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from core.canaries import canary_split
from core.models import Episode
from tests import factories
from tests.factories import add_group, make_environment, make_run
from trainer.config import LossConfig
from trainer.metrics import CANARY_EPISODES, CANARY_REWARD_MEAN, CANARY_REWARDED, batch_metrics
from trainer.rollouts import load_groups
from trainer.selection import StalenessRule, plan_batch


def test_a_canary_group_is_dropped_and_measured(db_session: Session) -> None:
    run = make_run(db_session, model="unused", batch_size=4)
    env, task = make_environment(db_session)
    canary_task = factories.task(db_session, env, split=canary_split("train"))
    ordinary = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0])
    canary = add_group(db_session, run=run, env=env, task=canary_task, rewards=[1.0, 0.0, 0.0])
    for index, score in enumerate((1.0, 0.0, 0.0)):  # one of three hacked the impossible task
        db_session.execute(update(Episode).where(Episode.group_id == canary.id, Episode.sample_index == index)
                           .values(reward_components={"hidden_tests": score}))
    db_session.commit()
    groups = load_groups(db_session, [ordinary, canary])
    assert [g.canary for g in groups] == [False, True]
    plan = plan_batch(groups, current_version=0, rule=StalenessRule.for_bound(1), batch_size=4, loss=LossConfig())
    assert [g.id for g in plan.groups] == [ordinary.id] and plan.dropped == {canary.id: "canary"}
    assert all(s.group_id != canary.id for s in plan.samples + plan.scored)  # never trained on, nor in rewards
    metrics = batch_metrics(plan)
    assert metrics[CANARY_EPISODES] == 3 and metrics[CANARY_REWARDED] == 1
    assert metrics[CANARY_REWARD_MEAN] == 1 / 3 and metrics["batch/dropped/canary"] == 1


def test_a_step_without_canaries_reports_none(db_session: Session) -> None:
    run = make_run(db_session, model="unused")
    env, task = make_environment(db_session)
    group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0])
    db_session.commit()
    plan = plan_batch(load_groups(db_session, [group]), current_version=0, rule=StalenessRule.for_bound(1), batch_size=2,
                      loss=LossConfig())
    assert CANARY_EPISODES not in batch_metrics(plan)
