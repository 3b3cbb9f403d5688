"""The benchmarks' paired statistics (bench/pairs.py) and the long-tail benchmark's stand-in trainer
(bench/episodes.py), which must consume groups as the real trainer does: the properties a sceptic checks."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from bench.pairs import interleave, paired_summary
from core.models import EpisodeGroup
from tests.factories import add_group, make_environment, make_run


def test_pairs_alternate_which_side_goes_first() -> None:
    calls: list[str] = []

    def side(name: str):  # type: ignore[no-untyped-def]
        return lambda: calls.append(name) or {"value": float(len(calls))}

    runs = interleave(pairs=4, sides={"a": side("a"), "b": side("b")})
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [r["position"] for r in runs["a"]] == [0, 1, 0, 1]
    assert [r["pair"] for r in runs["b"]] == [0, 1, 2, 3]


def test_the_summary_is_the_median_of_paired_ratios_not_a_ratio_of_medians() -> None:
    a = [{"v": 10.0}, {"v": 30.0}, {"v": 20.0}]
    b = [{"v": 10.0}, {"v": 10.0}, {"v": 40.0}]
    out = paired_summary(a, b, key="v")
    assert out["ratios"] == [1.0, 3.0, 0.5]
    assert (out["ratio_median"], out["ratio_min"], out["ratio_max"]) == (1.0, 0.5, 3.0)
    assert (out["a_p50"], out["b_p50"]) == (20.0, 10.0)  # 20/10 = 2 ≠ the paired median 1


@pytest.mark.parametrize(("a", "b"), [([], []), ([{"v": 1.0}], [])])
def test_unequal_or_empty_sides_are_refused(a: list, b: list) -> None:
    with pytest.raises(ValueError, match="expected the same non-zero number of results per side"):
        paired_summary(a, b, key="v")


@pytest.mark.parametrize("pairs", [0, -1])
def test_no_pairs_is_refused(pairs: int) -> None:
    with pytest.raises(ValueError, match=f"pairs: expected at least 1, got {pairs}"):
        interleave(pairs=pairs, sides={"a": dict, "b": dict})


def test_the_stand_in_trainer_waits_for_the_next_group_in_dispatch_order(db_session: Session) -> None:
    """A slow group is never overtaken by later fast ones: that would bias async toward fast tasks."""
    from bench.episodes import StandInTrainer

    run = make_run(db_session, model="/models/none", group_size=1, batch_size=2)
    env, task = make_environment(db_session)
    statuses = ["complete", "running", "complete", "complete"]  # group 1 is the slow tail
    groups = []
    for index, status in enumerate(statuses):
        group = EpisodeGroup(run_id=run.id, group_index=index, task_id=task.id, environment_id=env.id, size=1,
                             policy_version=0, status=status)
        db_session.add(group)
        groups.append(group)
    db_session.commit()
    trainer = StandInTrainer(run_id=run.id, batch_size=2, bound=1, step_s=0.0, updates=2, consume="dispatch",
                             url="http://127.0.0.1:9/v1")  # never called by _next_batch
    assert trainer._next_batch(db_session, 0) is None  # groups 2 and 3 are complete, but 1 is not
    # As the real trainer claims (--consume complete): the lowest complete groups, the slow one skipped.
    claimer = StandInTrainer(run_id=run.id, batch_size=2, bound=1, step_s=0.0, updates=2, consume="complete",
                             url="http://127.0.0.1:9/v1")
    assert [g.group_index for g in claimer._next_batch(db_session, 0)] == [0, 2]
    db_session.rollback()  # the claim's row locks
    groups[1].status = "complete"
    db_session.commit()
    assert [g.group_index for g in trainer._next_batch(db_session, 0)] == [0, 1]
    assert [g.group_index for g in trainer._next_batch(db_session, 2)] == [2, 3]


def test_the_stand_in_trains_with_the_real_rules_and_tags_the_server_with_each_version(db_session: Session) -> None:
    """The stand-in's own loop, on the database: complete groups claimed oldest dispatched first, the
    real plan_batch on the stored versions (token lags counted, nothing dropped within the cap), and the policy server
    tagged with each new version (as a weight sync does), so later tokens carry it."""
    from bench.episodes import StandInTrainer
    from task_workers.policy.scripted import ScriptedPolicy, serve

    run = make_run(db_session, model="/models/none", group_size=2, batch_size=2)
    env, task = make_environment(db_session)
    for version in (0, 0, 1, 1):
        add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=version)
    db_session.commit()
    policy = ScriptedPolicy()
    with serve(policy) as url:
        trainer = StandInTrainer(run_id=run.id, batch_size=2, bound=1, step_s=0.0, updates=2, consume="complete",
                                 url=url)
        trainer.run()
    db_session.expire_all()
    rows = db_session.query(EpisodeGroup).filter(EpisodeGroup.run_id == run.id).order_by(EpisodeGroup.group_index)
    assert [(g.status, g.consumed_step) for g in rows] == [
        ("consumed", 1), ("consumed", 1), ("consumed", 2), ("consumed", 2)]
    assert not trainer.drops and trainer.contrast_lost == 0 and trainer.masked == 0 and policy.weight_version == "2"
    assert sorted(trainer.trained) == sorted(trainer.examined)  # every sample of every group examined trained
    assert dict(trainer.token_lags) == {0: 96}  # 4 groups × 2 episodes × 12 sampled tokens, each trained on time
