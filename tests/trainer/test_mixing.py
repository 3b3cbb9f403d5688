"""Reward mixing with aligned scales (issue 15): a spec's `verifier.mix: zscore` makes the trainer
z-score each layer within its environment before Σ α × z, so a layer on a large scale (a judge's 0–100)
cannot drown a verifiable one (tests 0/1) — and the plain sum, for contrast, is drowned."""

from __future__ import annotations

import statistics

import pytest
from sqlalchemy.orm import Session

from core.errors import ConfigError
from environments.spec import parse_spec
from tests import factories
from tests.factories import add_group, make_run
from trainer.advantages import assign_advantages, mix_layers, normalize_per_environment
from trainer.config import LossConfig
from trainer.rollouts import Group, Sample, load_groups
from trainer.selection import StalenessRule, plan_batch

ALPHA = {"hidden_tests": 0.5, "judge": 0.5}
# Per episode: (tests passed?, the judge's score on a 0–100 scale). The judge disagrees with the tests.
EPISODES = [[(1.0, 10.0), (0.0, 90.0), (1.0, 20.0), (0.0, 80.0)], [(0.0, 30.0), (1.0, 70.0), (1.0, 40.0), (0.0, 60.0)]]


def _groups(*, mix: dict[str, float] | None, judge_scale: float = 1.0) -> list[Group]:
    groups = []
    for g, episodes in enumerate(EPISODES):
        samples = []
        for i, (tests, judge) in enumerate(episodes):
            judge *= judge_scale
            reward = ALPHA["hidden_tests"] * tests + ALPHA["judge"] * judge  # what the worker's plain sum gives
            samples.append(Sample(episode_id=10 * g + i, group_id=g, environment="code", status="completed",
                                  termination="submitted", reward=reward,
                                  components={"hidden_tests": tests, "judge": judge}, policy_version=0,
                                  token_ids=[5, 6, 7], loss_mask=[0, 1, 1], behaviour_logprobs=[0.0, -1.0, -1.0],
                                  score=reward))
        groups.append(Group(id=g, group_index=g, environment="code", policy_version=0, samples=samples, mix=mix))
    return groups


def _advantages(*, mix: dict[str, float] | None, judge_scale: float) -> list[float]:
    groups = _groups(mix=mix, judge_scale=judge_scale)
    mix_layers(groups)
    normalize_per_environment(groups, mode="on")
    assign_advantages(groups, scale_by_std=False)
    return [s.advantage for g in groups for s in g.samples]


def test_a_layers_scale_does_not_decide_its_weight_once_aligned() -> None:
    """The judge on 0–100 or on 0–1: with `mix: zscore` the advantages are the same (each layer pulls with
    its α); with the plain sum the 0–100 judge alone decides them."""
    judges = [judge for episodes in EPISODES for _, judge in episodes]
    tests = [t for episodes in EPISODES for t, _ in episodes]
    aligned_100 = _advantages(mix=ALPHA, judge_scale=1.0)
    aligned_1 = _advantages(mix=ALPHA, judge_scale=0.01)
    assert aligned_100 == pytest.approx(aligned_1, abs=1e-9)
    assert statistics.correlation(aligned_100, tests) > 0.3  # the tests still steer, against the judge
    summed_100 = _advantages(mix=None, judge_scale=1.0)
    summed_1 = _advantages(mix=None, judge_scale=0.01)
    assert statistics.correlation(summed_100, judges) > 0.999  # drowned: the judge alone
    assert summed_100 != pytest.approx(summed_1, abs=1e-3)


def test_mixing_is_alpha_times_each_layers_z_score() -> None:
    mixed = _groups(mix=ALPHA)
    stats = mix_layers(mixed)
    assert stats["code"]["hidden_tests"] == pytest.approx((0.5, 0.5)) and stats["code"]["judge"][0] == pytest.approx(50.0)
    first = mixed[0].samples[0]  # tests 1 (z = +1), judge 10
    assert first.score == pytest.approx(0.5 * 1.0 + 0.5 * (10.0 - 50.0) / stats["code"]["judge"][1])
    assert mix_layers(_groups(mix=None)) == {}


def test_a_layer_constant_in_the_batch_adds_nothing_and_shaping_is_kept() -> None:
    groups = _groups(mix={"hidden_tests": 1.0, "never_there": 5.0})
    groups[0].samples[0].score += -0.25  # an overlong penalty shaping added to the reward
    mix_layers(groups)
    assert groups[0].samples[0].score == pytest.approx(1.0 - 0.25)  # tests z = +1, the missing layer 0
    assert groups[0].samples[1].score == pytest.approx(-1.0)


def test_a_group_whose_rewards_tie_but_whose_layers_differ_is_trained_when_mixed() -> None:
    for mix, dropped in ((ALPHA, False), (None, True)):
        group = _groups(mix=mix)[0]
        for sample in group.samples:
            sample.reward = 1.0  # equal rewards, different layers
        plan = plan_batch([group], current_version=0, rule=StalenessRule.for_bound(1), batch_size=1, loss=LossConfig())
        assert (group.id in plan.dropped) == dropped


def test_the_spec_asks_for_mixing_and_the_trainer_reads_it(db_session: Session) -> None:
    with pytest.raises(ConfigError, match="mix: zscore mixes the layers named in weights"):
        parse_spec({"name": "m", "kind": "read_number", "image": "base", "verifier": {"mix": "zscore"}})
    spec = parse_spec({"name": "m", "kind": "read_number", "image": "base",
                       "verifier": {"mix": "zscore", "weights": {"answer": 0.7, "judge": 0.3, "submitted": 0}}})
    env = factories.environment(db_session, spec=spec.model_dump(mode="json"))
    task = factories.task(db_session, env)
    plain = factories.environment(db_session)
    run = make_run(db_session, model="m")
    groups = load_groups(db_session, [add_group(db_session, run=run, env=env, task=task, rewards=[0.0, 1.0]),
                                      add_group(db_session, run=run, env=plain, task=task, rewards=[0.0, 1.0])])
    assert groups[0].mix == {"answer": 0.7, "judge": 0.3} and groups[1].mix is None


def _env_groups(env: str, rewards: list[list[float]], start: int) -> list[Group]:
    groups = []
    for g, values in enumerate(rewards):
        samples = [Sample(episode_id=start + 10 * g + i, group_id=start + g, environment=env, status="completed",
                          termination="submitted", reward=r, components={"layer": r}, policy_version=0,
                          token_ids=[5, 6, 7], loss_mask=[0, 1, 1], behaviour_logprobs=[0.0, -1.0, -1.0], score=r)
                   for i, r in enumerate(values)]
        groups.append(Group(id=start + g, group_index=start + g, environment=env, policy_version=0, samples=samples))
    return groups


def test_per_environment_normalisation_is_in_the_step_metrics_and_the_large_scale_does_not_dominate() -> None:
    """A code environment (tests: 0 or 1) and a chat environment whose reward model pays 0–10 in one batch:
    raw, chat's spread is ~10× code's; the step's metrics show both normalised to std 1, and the
    advantages of the two environments are of one size (what each contributes to the gradient)."""
    from trainer.metrics import reward_metrics, trained_metrics

    code = _env_groups("code", [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]], start=0)
    chat = _env_groups("chat", [[9.5, 2.0, 6.0, 4.5], [1.0, 8.0, 3.5, 7.0]], start=100)
    groups = code + chat
    samples = [s for g in groups for s in g.samples]
    raw = reward_metrics(samples)
    assert raw["reward/chat/std"] > 5 * raw["reward/code/std"]
    normalize_per_environment(groups, mode="on")
    assign_advantages(groups, scale_by_std=False)  # Dr. GRPO: nothing but normalisation aligns the scales
    shown = trained_metrics(samples)
    assert shown["score/code/std"] == pytest.approx(1.0) and shown["score/chat/std"] == pytest.approx(1.0)
    assert shown["score/code/mean"] == pytest.approx(0.0, abs=1e-9) == shown["score/chat/mean"]
    ratio = shown["advantage/chat/abs_mean"] / shown["advantage/code/abs_mean"]
    assert 0.5 < ratio < 2.0, shown

    # Without normalisation the 0–10 environment's advantages are several times larger.
    unnormalised = code + chat
    for sample in samples:
        sample.score = sample.reward
    assign_advantages(unnormalised, scale_by_std=False)
    skewed = trained_metrics(samples)
    assert skewed["advantage/chat/abs_mean"] > 5 * skewed["advantage/code/abs_mean"]


def test_each_layers_raw_and_aligned_distributions_are_step_metrics() -> None:
    """The run page shows each component raw (`reward/{env}/{layer}/mean|std`) and as mixed
    (`score/{env}/{layer}/mean|std`: its α·z): the 0–100 judge and the 0/1 tests, raw ~50× apart,
    each pull with std α once aligned."""
    from trainer.metrics import reward_metrics, trained_metrics

    groups = _groups(mix=ALPHA)
    samples = [s for g in groups for s in g.samples]
    raw = reward_metrics(samples)
    assert raw["reward/code/judge/std"] > 40 * raw["reward/code/hidden_tests/std"]
    mix_layers(groups)
    normalize_per_environment(groups, mode="on")
    assign_advantages(groups, scale_by_std=True)
    shown = trained_metrics(samples)
    for layer, alpha in ALPHA.items():
        assert shown[f"score/code/{layer}/mean"] == pytest.approx(0.0, abs=1e-9)
        assert shown[f"score/code/{layer}/std"] == pytest.approx(alpha)
    unmixed = _groups(mix=None)
    assert not any("/judge/" in key or "/hidden_tests/" in key
                   for key in trained_metrics([s for g in unmixed for s in g.samples]))
