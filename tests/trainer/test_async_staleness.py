"""Asynchronous GRPO without staleness drops (issue 23): the admission bound, the token-level staleness
mask, per-span importance weights, drop reasons on every group, no bias against long tasks.

The simulations drive the real functions (controller.dispatch.allowance, trainer.selection.plan_batch,
trainer.loss.policy_loss) over synthetic groups with random durations; the store-level tests use the
real Postgres.
"""

from __future__ import annotations

import heapq
import random
import statistics
from dataclasses import dataclass, field

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.dispatch import allowance
from controller.progress import RunProgress
from core.models import Episode, EpisodeGroup, Turn
from core.schemas import RunConfig
from core.termination import DropReason, GroupStatus
from core.token_versions import decode, encode, from_spans
from tests.factories import add_group, make_environment, make_run
from trainer import metrics
from trainer.advantages import assign_advantages
from trainer.config import LossConfig
from trainer.loss import TokenTensors, policy_loss
from trainer.packing import collate
from trainer.rollouts import ENVIRONMENT, Group, MalformedSample, Sample, load_groups
from trainer.selection import Pacer, StalenessRule, may_step, plan_batch
from trainer.store import oldest_waiting_version, record_step


def _sample(episode_id: int, *, reward: float, versions: list[int], group_id: int = 0, prompt: int = 3,
            behaviour: list[float] | None = None) -> Sample:
    """One turn: `prompt` environment tokens, then one sampled token per entry of `versions`."""
    sampled = len(versions)
    return Sample(
        episode_id=episode_id, group_id=group_id, environment="e", status="completed", termination="submitted",
        reward=reward, components={}, policy_version=min(versions), token_ids=list(range(3, 3 + prompt + sampled)),
        loss_mask=[0] * prompt + [1] * sampled,
        behaviour_logprobs=[0.0] * prompt + (behaviour or [-1.0] * sampled),
        token_versions=[ENVIRONMENT] * prompt + versions)


# -- the encoding -----------------------------------------------------------------------------------

def test_version_runs_round_trip_and_refuse_what_cannot_be_trusted() -> None:
    assert encode([3, 3, 3, 4, 4]) == [3, 3, 4, 2] and decode([3, 3, 4, 2]) == [3, 3, 3, 4, 4]
    assert from_spans([(3, 0, 2), (3, 2, 3), (4, 3, 5)], length=5) == [3, 3, 4, 2]  # same version: one run
    for runs, why in [([3], "pairs"), ([3, 0], "count ≥ 1"), ([-1, 2], "version ≥ 0"), ([4, 1, 3, 1], "go back")]:
        with pytest.raises(ValueError, match=why):
            decode(runs)
    with pytest.raises(ValueError, match="expected 4 tokens, got 3"):
        decode([1, 3], length=4)
    with pytest.raises(ValueError, match="starting at token 2"):
        from_spans([(1, 0, 2), (2, 3, 5)], length=5)  # a gap
    with pytest.raises(ValueError, match="cover 6 tokens, they cover 5"):
        from_spans([(1, 0, 5)], length=6)


def test_a_sample_whose_arrays_do_not_line_up_is_refused_at_load() -> None:
    with pytest.raises(MalformedSample, match=r"episode 9: .*'token_ids': 4, 'loss_mask': 4, 'behaviour_logprobs': 3"):
        Sample(episode_id=9, group_id=0, environment="e", status="completed", termination="submitted", reward=1.0,
               components={}, policy_version=0, token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1],
               behaviour_logprobs=[0.0, -1.0, -1.0])
    with pytest.raises(MalformedSample, match="'token_versions': 2"):
        Sample(episode_id=9, group_id=0, environment="e", status="completed", termination="submitted", reward=1.0,
               components={}, policy_version=0, token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
               behaviour_logprobs=[0.0, -1.0, -1.0], token_versions=[-1, 0])


def test_stored_version_runs_of_the_wrong_length_are_refused_when_the_trainer_loads_them(db_session: Session) -> None:
    """Refused, never trained misaligned: the sample is left out of its group (issue 47, item 10)."""
    run = make_run(db_session, model="unused")
    env, task = make_environment(db_session)
    turns = [{"index": 0, "token_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1], "logprobs": [0.0, 0.0, -1.0, -1.0],
              "prompt_length": 2, "finish_reason": "stop", "version_runs": [0, 3]}]
    group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0], turns=[turns])
    db_session.commit()
    [loaded] = load_groups(db_session, [group])
    episode = db_session.execute(select(Episode.id).where(Episode.group_id == group.id)).scalar_one()
    assert loaded.samples == [] and loaded.malformed == [episode]


# -- (I2) the token-level staleness mask ---------------------------------------------------------------

def test_no_token_lagging_past_the_bound_carries_loss_weight() -> None:
    """η = 1: tokens 3+ versions behind (2η = 2) keep their place in the context, lose their weight."""
    rule = StalenessRule.for_bound(1)
    assert (rule.max_token_staleness, rule.stale_cap_lag) == (2, 4)
    mixed = _sample(1, reward=1.0, versions=[2, 2, 5, 5, 5, 5])  # at version 5: 3 behind, then 0
    honest = _sample(2, reward=0.0, versions=[4, 4, 4, 5, 5, 5])
    group = Group(id=0, group_index=0, environment="e", policy_version=2, samples=[mixed, honest])
    plan = plan_batch([group], current_version=5, rule=rule, batch_size=1, loss=LossConfig())
    assert plan.dropped == {} and plan.masked_tokens == 2 and plan.token_lags == {3: 2, 1: 3, 0: 7}
    assert mixed.trained_mask == [0, 0, 0, 0, 0, 1, 1, 1, 1] and honest.loss_weights is None
    batch = collate([mixed, honest])
    assert batch.mask[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # position t scores token t+1
    assert batch.input_ids[0].tolist() == mixed.token_ids  # the masked tokens are still in the context
    found = metrics.batch_metrics(plan)
    assert found[metrics.TOKEN_LAG_MAX_WEIGHTED] == 1 <= rule.max_token_staleness
    assert found[metrics.TOKEN_MASKED] == pytest.approx(2 / 12) and found["policy/token_lag/hist/3"] == 2
    # And the loss: a masked token gets no gradient whatever its logprob.
    logp = torch.randn(batch.mask.shape, requires_grad=True)
    tensors = TokenTensors(logp=logp, prox_logp=logp.detach(), behav_logp=batch.behav_logp,
                           advantages=torch.ones_like(batch.mask), mask=batch.mask)
    loss, stats = policy_loss(tensors, total_tokens=int(batch.mask.sum()), loss=LossConfig())
    loss.backward()
    assert logp.grad is not None and logp.grad[0, :4].abs().sum() == 0 and logp.grad[0, 4:].abs().min() > 0
    assert stats["tokens"] == 10


def test_a_sample_past_the_hard_cap_is_left_out_and_counted_as_stale_cap() -> None:
    """Only the hard cap leaves a sample out; one whose every token is masked stays in its group's
    baseline (no gradient) — here it is the only one left of its group, which goes as `stale_cap`."""
    rule = StalenessRule.for_bound(1)
    ancient = _sample(1, reward=1.0, versions=[0, 6, 6, 6, 6, 6])  # one token 6 behind (> 4η)
    all_old = _sample(2, reward=0.0, versions=[3, 3, 3, 3])  # every token masked: in the baseline, no gradient
    mostly_old = _sample(7, reward=0.0, versions=[3, 3, 3, 3, 6, 6])  # 4 of 6 masked: the rest trains
    fine = [_sample(3 + i, reward=float(i), versions=[5, 6, 6]) for i in range(2)]
    groups = [Group(id=0, group_index=0, environment="e", policy_version=0, samples=[ancient, all_old]),
              Group(id=1, group_index=1, environment="e", policy_version=5, samples=fine),
              Group(id=2, group_index=2, environment="e", policy_version=3,
                    samples=[mostly_old, _sample(8, reward=1.0, versions=[6, 6])])]
    plan = plan_batch(groups, current_version=6, rule=rule, batch_size=3, loss=LossConfig())
    assert plan.dropped == {0: DropReason.STALE_CAP} and plan.left_out == {"stale_cap": 1}
    assert [g.id for g in plan.groups] == [1, 2] and mostly_old.trained_mask == [0, 0, 0, 0, 0, 0, 0, 1, 1]


def test_a_slow_episode_never_takes_its_fast_siblings_out_of_the_baseline() -> None:
    """The review's e7 case (η = 1): three quick successes sampled at version 0, one slow failure whose
    tokens span versions 0-3, trained at version 3. Before: the quick ones (every token masked) left the
    group, which was dropped as zero_variance. Now the group trains on all four rewards: the slow failure
    with advantage −0.75, the quick ones +0.25 with no loss weight (their tokens are past the mask)."""
    rule = StalenessRule.for_bound(1)
    quick = [_sample(i, reward=1.0, versions=[0, 0, 0]) for i in range(3)]
    slow = _sample(9, reward=0.0, versions=[0, 1, 2, 3, 3])
    group = Group(id=0, group_index=0, environment="e", policy_version=0, samples=[*quick, slow])
    plan = plan_batch([group], current_version=3, rule=rule, batch_size=1, loss=LossConfig())
    assert plan.dropped == {} and [g.id for g in plan.groups] == [0] and len(plan.groups[0].samples) == 4
    assign_advantages(plan.groups, scale_by_std=False)
    assert slow.advantage == pytest.approx(-0.75) and all(q.advantage == pytest.approx(0.25) for q in quick)
    assert all(sum(q.trained_mask) == 0 for q in quick) and sum(slow.trained_mask) > 0


def test_a_group_left_with_one_sample_because_the_others_failed_says_so() -> None:
    rule = StalenessRule.for_bound(1)
    failed = [_sample(i, reward=0.0, versions=[1, 1]) for i in range(2)]
    for sample in failed:
        sample.status = "failed"
    group = Group(id=5, group_index=0, environment="e", policy_version=1,
                  samples=[*failed, _sample(3, reward=1.0, versions=[1, 1])])
    plan = plan_batch([group], current_version=1, rule=rule, batch_size=1, loss=LossConfig())
    assert plan.dropped == {5: DropReason.TOO_FEW_SAMPLES}


# -- (I4) per-span importance weights --------------------------------------------------------------------

def test_a_two_span_sample_gets_each_spans_own_importance_weight() -> None:
    """Tokens 0-2 sampled by version 3 (logprob −2), 3-5 by version 4 (logprob −0.5); π_prox = −1 on every
    token: w = e^{−1+2} = e (capped at 2) on the first span, e^{−0.5} on the second."""
    sample = _sample(1, reward=1.0, versions=[3, 3, 3, 4, 4, 4], behaviour=[-2.0] * 3 + [-0.5] * 3)
    sample.advantage = 1.0
    batch = collate([sample])
    prox = torch.where(batch.mask.bool(), torch.tensor(-1.0), torch.tensor(0.0))
    logp = prox.clone().requires_grad_(True)
    loss, _ = policy_loss(TokenTensors(logp=logp, prox_logp=prox, behav_logp=batch.behav_logp,
                                       advantages=batch.advantages, mask=batch.mask),
                          total_tokens=6, loss=LossConfig())
    loss.backward()
    assert logp.grad is not None
    weights = (-logp.grad[0] * 6)[batch.mask[0].bool()]  # ∂(−L)/∂logp_t = w_t · A · u_t / N, u = 1, A = 1
    expected = torch.tensor([min(2.0, torch.e)] * 3 + [float(torch.exp(torch.tensor(-0.5)))] * 3)
    torch.testing.assert_close(weights, expected)


# -- (I1, I5, I7) a long simulated run: the admission bound, reasons, no length bias -----------------------

@dataclass
class _SimGroup:
    index: int
    task: int
    seconds: list[float]
    """Each sample's duration: its task's typical seconds × its own lognormal(0, σ) draw."""
    rewards: list[float]
    """1.0 for a sample faster than its task's typical (the agent that submits early), else 0.0."""
    dispatched_at: int  # the published version when dispatched
    started: float = 0.0
    """When it was dispatched (simulated seconds)."""
    status: str = GroupStatus.RUNNING
    reason: str | None = None
    versions: list[list[int]] = field(default_factory=list)
    """Per sample, the version of each sampled token (one token per tenth of a second)."""


@dataclass
class _Sim:
    groups: list[_SimGroup]
    checks: list[tuple[int, int, int]]
    """(started, rejected, bound) at every dispatch decision."""
    trained: list[int]
    """The group indexes the trainer trained on, in order."""
    examined_s: list[float] = field(default_factory=list)
    """The seconds of every trainable sample of every group the trainer examined (trained or dropped)."""
    trained_s: list[float] = field(default_factory=list)
    """The seconds of every sample in a trained group's baseline."""
    contrast_lost: int = 0
    """Groups whose trainable samples' rewards differ, dropped all the same."""
    waiting: list[int] = field(default_factory=list)
    """Groups neither consumed nor dropped (running or complete), counted at every dispatch decision."""


def _simulate(*, seed: int, staleness: int, batch: int, updates: int, step_s: float, slots: int,
              sigma: float = 1.0, group_size: int = 4) -> _Sim:
    """Event-driven: the controller dispatches within `allowance` (the real function; at most `slots`
    in flight); each sample of a group lasts its task's Pareto-distributed seconds times its own
    lognormal(0, `sigma`) draw (one agent submits at turn 2, another wanders to max_turns) and samples
    one token per tenth of a second with the version current at that moment; the group is complete
    when its slowest sample ends. The trainer, paced by the real `may_step`, takes `batch` complete
    groups, oldest dispatched first, through the real plan_batch."""
    rng = random.Random(seed)
    tasks = [min(30.0, 0.5 * rng.paretovariate(1.3)) for _ in range(40)]
    config = RunConfig(name="sim", model="m", environments=[{"name": "e"}], batch_size=batch,
                       max_staleness=staleness, max_inflight_groups=slots)
    rule = StalenessRule.for_bound(staleness)

    class _Run:
        purpose, max_staleness, batch_size, policy_version = "train", staleness, batch, 0

    run = _Run()
    sim = _Sim(groups=[], checks=[], trained=[])
    groups = sim.groups
    events: list[tuple[float, int, int]] = []  # (time, kind 0 = group done / 1 = step done, index)
    now, training = 0.0, False
    version_at: list[tuple[float, int]] = [(0.0, 0)]

    def version_then(t: float) -> int:
        return max(v for at, v in version_at if at <= t)

    def progress() -> RunProgress:
        counts: dict[str, int] = {}
        reasons: dict[str, int] = {}
        for g in groups:
            counts[g.status] = counts.get(g.status, 0) + 1
            if g.reason:
                reasons[g.reason] = reasons.get(g.reason, 0) + 1
        return RunProgress(groups=counts, drop_reasons=reasons)

    def dispatch() -> None:
        while True:
            state = progress()
            room = allowance(run=run, config=config, progress=state)  # type: ignore[arg-type]
            sim.checks.append((state.dispatched, state.replaced, (run.policy_version + staleness + 1) * batch))
            sim.waiting.append(sum(g.status in (GroupStatus.RUNNING, GroupStatus.COMPLETE) for g in groups))
            if room.groups == 0:
                return
            task = rng.randrange(len(tasks))
            draws = [rng.lognormvariate(0.0, sigma) for _ in range(group_size)]
            group = _SimGroup(index=len(groups), task=task, seconds=[tasks[task] * d for d in draws],
                              rewards=[1.0 if d < 1.0 else 0.0 for d in draws], dispatched_at=run.policy_version,
                              started=now)
            groups.append(group)
            group.versions = [[version_at[-1][1]] for _ in draws]  # filled in when it ends
            heapq.heappush(events, (now + max(group.seconds), 0, group.index))

    def try_step() -> None:
        nonlocal training
        if training or run.policy_version >= updates:
            return
        complete = sorted((g for g in groups if g.status == GroupStatus.COMPLETE), key=lambda g: g.index)
        if len(complete) < batch:
            return
        seconds_of: dict[int, float] = {}
        candidates = []
        for g in complete:
            samples = []
            for i, (reward, versions) in enumerate(zip(g.rewards, g.versions, strict=True)):
                samples.append(_sample(len(g.rewards) * g.index + i, reward=reward, versions=versions, group_id=g.index))
                seconds_of[samples[-1].episode_id] = g.seconds[i]
            candidates.append(Group(id=g.index, group_index=g.index, environment="e", policy_version=g.dispatched_at,
                                    samples=samples))
        trainable = {c.id: [s for s in c.samples if s.trainable] for c in candidates}  # before plan_batch keeps some
        plan = plan_batch(candidates, current_version=run.policy_version, rule=rule, batch_size=batch, loss=LossConfig())
        assert plan.max_weighted_lag is None or plan.max_weighted_lag <= rule.max_token_staleness  # (I2)
        if len(plan.groups) < batch and not plan.dropped:
            return
        for gid, reason in plan.dropped.items():  # a drop is final: examined now, whether a step follows or not
            groups[gid].status, groups[gid].reason = GroupStatus.DROPPED, reason
            sim.contrast_lost += len({sample.reward for sample in trainable[gid]}) > 1
            sim.examined_s += [seconds_of[sample.episode_id] for sample in trainable[gid]]
        if len(plan.groups) < batch:
            return
        batch_ids = {g.id for g in plan.groups}
        waiting = [g.dispatched_at for g in groups if g.status == GroupStatus.RUNNING or (
            g.status == GroupStatus.COMPLETE and g.index not in batch_ids)]
        if not may_step(version=run.policy_version, oldest_waiting=min(waiting, default=None), rule=rule):
            return  # the trainer's pacing: it waits for a group its step would leave past the hard cap
        for chosen in plan.groups:
            sim.examined_s += [seconds_of[sample.episode_id] for sample in trainable[chosen.id]]
            groups[chosen.id].status = GroupStatus.CONSUMED
            sim.trained.append(chosen.id)
            sim.trained_s += [seconds_of[sample.episode_id] for sample in chosen.samples]
        training = True
        heapq.heappush(events, (now + step_s, 1, -1))

    dispatch()
    while events and run.policy_version < updates:
        now, kind, index = heapq.heappop(events)
        if kind == 0:
            g = groups[index]
            for i, seconds in enumerate(g.seconds):
                tokens = max(1, int(seconds * 10))
                g.versions[i] = [version_then(g.started + (t + 0.5) * seconds / tokens) for t in range(tokens)]
            g.status = GroupStatus.COMPLETE
        else:
            training = False
            run.policy_version += 1
            version_at.append((now, run.policy_version))
        try_step()
        dispatch()
    return sim


@pytest.mark.parametrize("seed", range(6))
def test_admission_bound_holds_at_every_dispatch_and_nothing_drops_for_staleness(seed: int) -> None:
    """(I1) started − dropped ≤ (published version + η + 1)·B at every dispatch decision (every drop frees
    its slot, issue 47 item 4); (I5) every ended group is consumed, complete (waiting) or carries a
    named reason; no group is dropped for staleness inside the bound."""
    sim = _simulate(seed=seed, staleness=2, batch=4, updates=60, step_s=1.0, slots=16)
    assert sim.checks and all(started - rejected <= bound for started, rejected, bound in sim.checks)
    assert max(sim.waiting) <= (2 + 1) * 4  # counted from the groups themselves: never more than (η + 1)·B
    assert any(g.reason == DropReason.ZERO_VARIANCE for g in sim.groups)  # replaced, within the bound
    for g in sim.groups:
        assert g.status in (GroupStatus.CONSUMED, GroupStatus.COMPLETE, GroupStatus.RUNNING) or (
            g.status == GroupStatus.DROPPED and g.reason in set(DropReason))
    assert not [g for g in sim.groups if g.reason == DropReason.STALE_CAP]
    for g in sim.groups:  # (I6) versions never go back within an episode
        assert all(versions == sorted(versions) for versions in g.versions)


def test_pacing_keeps_every_token_within_the_hard_cap() -> None:
    """The trainer waits rather than leave a running group past 4η: no sample is ever capped, and the
    token mask takes the loss weight from a small share only (the heads of the slowest tasks)."""
    rule = StalenessRule.for_bound(2)
    assert may_step(version=9, oldest_waiting=2, rule=rule) and not may_step(version=9, oldest_waiting=1, rule=rule)
    assert may_step(version=9, oldest_waiting=None, rule=rule)
    assert not may_step(version=3, oldest_waiting=3, rule=StalenessRule.for_bound(0))  # sync: wait for all


def test_the_oldest_waiting_group_counts_one_that_completed_after_the_claim(db_session: Session) -> None:
    """A group that completes between the trainer's claim and its pacing check is not in the batch: the
    step would leave it a version further behind, so it counts (before the fix only running ones did,
    and such a group was dropped past the cap on the long-tail bench)."""
    run = make_run(db_session, model="unused")
    env, task = make_environment(db_session)
    late = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=1)
    claimed = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=5)
    add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=3, status="running")
    add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=0, status="consumed")
    db_session.commit()
    assert oldest_waiting_version(db_session, run_id=run.id, batch={claimed.id}) == 1
    assert oldest_waiting_version(db_session, run_id=run.id, batch={claimed.id, late.id}) == 3


def _out_of_the_baseline_when_masked(lags: list[int], rule: StalenessRule) -> bool:
    """The rule before issue 47: a sample whose every token lost its loss weight left its group."""
    return bool(lags) and (max(lags) > rule.stale_cap_lag or min(lags) > rule.max_token_staleness)


@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_the_trained_samples_last_as_long_as_the_examined_ones(sigma: float) -> None:
    """(I7, issue 47 item 1) Over a long run with heavy-tailed task durations AND a lognormal spread
    of durations within each group (σ = 1: one sample submits at once, a sibling wanders 10× longer),
    the samples trained on are not the fast ones: their mean duration is within ±5 % of the examined
    samples', and no group with a reward contrast is lost inside the cap."""
    sim = _simulate(seed=11, staleness=2, batch=4, updates=300, step_s=0.5, slots=16, sigma=sigma)
    ratio = statistics.fmean(sim.trained_s) / statistics.fmean(sim.examined_s)
    assert 0.95 <= ratio <= 1.05, ratio
    assert sim.contrast_lost == 0
    assert len(set(sim.trained)) == len(sim.trained)  # (I6) each group consumed once


def test_the_simulation_sees_the_baseline_lost_to_a_slow_sibling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same run under the old rule (a fully masked fast sibling left its group's baseline): groups
    with a reward contrast are lost. The simulation can see what the test above rules out."""
    monkeypatch.setattr("trainer.selection.past_cap", _out_of_the_baseline_when_masked)
    sim = _simulate(seed=11, staleness=2, batch=4, updates=300, step_s=0.5, slots=16, sigma=1.0)
    assert sim.contrast_lost > 0


# -- (I5) the store: every drop with its reason and step ---------------------------------------------------

def test_a_dropped_group_stores_why_and_when(db_session: Session) -> None:
    run = make_run(db_session, model="unused", batch_size=1, max_staleness=1)
    env, task = make_environment(db_session)
    solved = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 1.0], version=3)
    broken = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=3, failed=(0, 1))
    kept = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], version=3)
    db_session.commit()
    plan = plan_batch(load_groups(db_session, [solved, broken, kept]), current_version=3,
                      rule=StalenessRule.for_bound(1), batch_size=1, loss=LossConfig())
    record_step(db_session, run_id=run.id, step=4, policy_version=4, consumed=[kept.id], dropped=plan.dropped,
                metrics={})
    db_session.commit()
    rows = {g.id: (g.status, g.drop_reason, g.dropped_step, g.consumed_step) for g in db_session.execute(
        select(EpisodeGroup).where(EpisodeGroup.run_id == run.id).execution_options(populate_existing=True)).scalars()}
    assert rows == {solved.id: ("dropped", "zero_variance", 3, None), broken.id: ("dropped", "failed", 3, None),
                    kept.id: ("consumed", None, None, 4)}
    assert db_session.execute(select(Turn.version_runs).where(Turn.run_id == run.id)).first() is not None


def test_a_stale_cap_drop_frees_its_admission_slot_like_any_drop() -> None:
    """Issue 47, item 4: a stale-cap drop that held its slot narrowed the window for good."""
    config = RunConfig(name="r", model="m", environments=[{"name": "e"}], batch_size=2, max_staleness=1,
                       max_inflight_groups=100)

    class _Run:
        purpose, max_staleness, batch_size, policy_version = "train", 1, 2, 0

    replaced = RunProgress(groups={"dropped": 2, "complete": 2}, drop_reasons={"zero_variance": 2})
    stale = RunProgress(groups={"dropped": 2, "complete": 2}, drop_reasons={"stale_cap": 2})
    assert allowance(run=_Run(), config=config, progress=replaced).groups == 2  # type: ignore[arg-type]
    assert allowance(run=_Run(), config=config, progress=stale).groups == 2  # type: ignore[arg-type]


def test_the_last_batch_waits_for_a_complete_group_another_transaction_holds(db_session: Session, engine) -> None:
    """The budget is spent and nothing runs, but a complete group is row-locked elsewhere (the claim's
    SKIP LOCKED passes over it): the batch is not the last, the trainer waits for that group rather than
    train fewer and stop one group short (seen on the long-tail bench: 254 of 256 samples trained)."""
    from types import SimpleNamespace

    from trainer.loop import Trainer
    from trainer.store import claim_complete_groups, complete_groups_besides

    run = make_run(db_session, model="unused", max_groups=2)
    env, task = make_environment(db_session)
    first = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0])
    held = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0])
    db_session.commit()
    with Session(engine) as other:
        other.execute(select(EpisodeGroup).where(EpisodeGroup.id == held.id).with_for_update()).one()
        claimed = claim_complete_groups(db_session, run_id=run.id, limit=2)
        assert [g.id for g in claimed] == [first.id]
        assert complete_groups_besides(db_session, run_id=run.id, claimed={first.id}) == 1
        trainer = SimpleNamespace(batch_size=2, run_id=run.id)
        plan = SimpleNamespace(groups=[SimpleNamespace(id=first.id)], dropped={})
        assert Trainer._batch_ready(trainer, db_session, plan) is False  # type: ignore[arg-type]
        other.rollback()
    db_session.rollback()
    assert complete_groups_besides(db_session, run_id=run.id, claimed={first.id, held.id}) == 0
    plan = SimpleNamespace(groups=[SimpleNamespace(id=first.id), SimpleNamespace(id=held.id)], dropped={})
    assert Trainer._batch_ready(SimpleNamespace(batch_size=3, run_id=run.id), db_session, plan) is True  # type: ignore[arg-type]


def test_the_trainer_waits_for_a_hanging_group_once_not_at_every_step() -> None:
    """Issue 47, item 5: with one group hanging (dispatched at version 0, never complete), the pacing
    escape used to wait `lag_wait_s` again before every later step. It waits once for that group."""
    rule = StalenessRule.for_bound(1)  # hard cap 4
    pacer = Pacer(rule, lag_wait_s=300.0)
    assert pacer.go(version=3, oldest_waiting=0, now=0.0)  # 4 - 0 <= 4: no wait yet
    assert not pacer.go(version=4, oldest_waiting=0, now=10.0)  # would leave it 5 behind: wait
    assert not pacer.go(version=4, oldest_waiting=0, now=309.0)
    assert pacer.go(version=4, oldest_waiting=0, now=310.0)  # waited lag_wait_s: go ahead, once
    assert pacer.go(version=5, oldest_waiting=0, now=311.0) and pacer.go(version=6, oldest_waiting=0, now=312.0)
    assert not pacer.go(version=6, oldest_waiting=2, now=313.0)  # a newer group is waited for, as before
