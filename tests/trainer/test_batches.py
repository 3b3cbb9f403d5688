"""Batch assembly from the store (real Postgres): claims exactly once, drops, staleness, failures."""

from __future__ import annotations

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.models import EpisodeGroup, TrainingStep
from tests.factories import add_group, make_environment, make_run
from trainer.config import LossConfig
from trainer.rollouts import load_groups
from trainer.selection import StalenessRule, plan_batch
from trainer.step import generate
from trainer.store import claim_complete_groups, record_step


def _statuses(session: Session, run_id: int) -> dict[int, tuple[str, int | None]]:
    session.expire_all()
    rows = session.execute(select(EpisodeGroup).where(EpisodeGroup.run_id == run_id)).scalars()
    return {g.group_index: (g.status, g.consumed_step) for g in rows}


def test_turns_concatenate_into_one_sequence_per_episode(db_session: Session) -> None:
    run = make_run(db_session, model="unused")
    env, task = make_environment(db_session, name="numbers")
    group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], seed=3)
    db_session.commit()
    [loaded] = load_groups(db_session, [group])
    assert loaded.environment == "numbers" and [s.reward for s in loaded.samples] == [1.0, 0.0]
    first = loaded.samples[0]
    assert len(first.token_ids) == len(first.loss_mask) == len(first.behaviour_logprobs)
    assert first.sampled_tokens == 12 and first.turns == 2 and first.components == {"answer": 1.0}
    assert all(lp < 0 for lp, m in zip(first.behaviour_logprobs, first.loss_mask, strict=True) if m)


def test_plan_drops_zero_variance_past_the_stale_cap_and_failed(db_session: Session) -> None:
    """A group behind the trainer by up to the token bound (2η) is trained on, not dropped; only one past
    the hard cap (4η) is, as `stale_cap`; every sample failed is `failed`."""
    run = make_run(db_session, model="unused", batch_size=2, max_staleness=1)
    env, task = make_environment(db_session)
    solved = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 1.0, 1.0], version=6)
    ancient = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=1)
    mixed = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0, 0.0], version=6, failed=(1,))
    broken = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=6, failed=(0, 1))
    lagging = add_group(db_session, run=run, env=env, task=task, rewards=[0.0, 1.0], version=4)
    extra = add_group(db_session, run=run, env=env, task=task, rewards=[0.0, 1.0], version=6)
    db_session.commit()
    groups = load_groups(db_session, [solved, ancient, mixed, broken, lagging, extra])
    plan = plan_batch(groups, current_version=6, rule=StalenessRule.for_bound(1), batch_size=2, loss=LossConfig())
    assert [g.id for g in plan.groups] == [mixed.id, lagging.id]  # `extra` waits for the next step
    assert plan.dropped == {solved.id: "zero_variance", ancient.id: "stale_cap", broken.id: "failed"}
    assert len(plan.groups[0].samples) == 2  # the failed sample is left out
    assert plan.left_out == {"failed": 3, "stale_cap": 2}
    assert sorted(plan.staleness) == [0, 0, 2, 2] and plan.masked_tokens == 0
    assert plan.token_lags == {0: 24, 2: 24} and plan.max_weighted_lag == 2


def test_claims_skip_locked_groups_and_a_rollback_releases_them(db_session: Session, engine: Engine) -> None:
    run = make_run(db_session, model="unused", batch_size=2)
    env, task = make_environment(db_session)
    for seed in range(3):
        add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], seed=seed)
    add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], status="running")
    db_session.commit()
    with Session(engine) as first, Session(engine) as second:
        mine = claim_complete_groups(first, run_id=run.id, limit=2)
        theirs = claim_complete_groups(second, run_id=run.id, limit=10)
        assert [g.group_index for g in mine] == [0, 1]
        assert [g.group_index for g in theirs] == [2]  # never a group the first holds, never a running one
        first.rollback()  # a trainer that died mid-step: its groups come back
        second.rollback()
        again = claim_complete_groups(second, run_id=run.id, limit=10)
        assert [g.group_index for g in again] == [0, 1, 2]
        second.rollback()


def test_a_step_consumes_its_groups_in_the_transaction_that_records_it(db_session: Session, engine: Engine) -> None:
    run = make_run(db_session, model="unused", batch_size=2)
    env, task = make_environment(db_session)
    for rewards in ([1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.0]):
        add_group(db_session, run=run, env=env, task=task, rewards=rewards)
    db_session.commit()
    with Session(engine) as step_session:
        plan = generate(step_session, run_id=run.id, version=0, rule=StalenessRule.for_bound(1), batch_size=2, loss=LossConfig())
        assert [g.group_index for g in plan.groups] == [1, 2] and list(plan.dropped.values()) == ["zero_variance"]
        assert _statuses(db_session, run.id)[1] == ("complete", None)  # nothing visible before the commit
        record_step(step_session, run_id=run.id, step=1, policy_version=1, consumed=[g.id for g in plan.groups],
                    dropped=plan.dropped, metrics={"loss/policy": 0.1})
        step_session.commit()
    assert _statuses(db_session, run.id) == {0: ("dropped", None), 1: ("consumed", 1), 2: ("consumed", 1),
                                             3: ("complete", None)}
    row = db_session.execute(select(TrainingStep).where(TrainingStep.run_id == run.id)).scalar_one()
    assert row.step == 1 and row.metrics == {"loss/policy": 0.1}
