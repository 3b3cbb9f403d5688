"""environments/rewards.py: one home for what an episode's layers are worth — weights, the flag policy
charged once, learned-layer weights, zero variance, the reward derived once (`total`) — and no other
module spelling the rules out. That a stored episode's reward is `total` of its stored layers and flags,
for every kind and the pairwise judge: tests/support/rewards.py, called by each kind's episode tests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from core.flags import EpisodeFlag
from environments.base import LayerResult, ToolCall, Verdict
from environments.chat.kind import ChatTask
from environments.judge import flag_injection
from environments.read_number.task import ReadNumberTask
from environments.registry import get_kind, kind_names
from environments.rewards import (
    ZERO_VARIANCE_SPREAD,
    FlagPolicy,
    Reward,
    has_variance,
    layer_weights,
    spec_weights,
    total,
    weighted_sum,
    zscore_alphas,
)
from environments.spec import EnvironmentSpec, VerifierConfig

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("core", "sandboxes", "environments", "task_workers", "controller", "trainer", "api", "cli")


JUDGE = {"url": "http://127.0.0.1:9/v1", "model": "judge", "rubric": "Helpful and correct."}


def _spec(kind: str, **verifier: Any) -> EnvironmentSpec:
    if kind == "chat":  # a chat environment is scored by a learned layer only
        verifier = {"judge": JUDGE, **verifier}
    return EnvironmentSpec.model_validate({
        "name": f"{kind.replace('_', '-')}-rewards", "kind": kind, "image": "code-repo",
        "limits": {"max_turns": 3, "episode_timeout_s": 60, "tool_timeout_s": 5, "max_tool_errors": 2},
        "verifier": verifier, **({"task_format": "miniwob"} if kind == "browser" else {})})


def _layers(**scores: float) -> list[LayerResult]:
    return [LayerResult(name, score, score > 0, "") for name, score in scores.items()]


def test_the_spec_weights_replace_the_kinds_defaults_and_an_unnamed_layer_counts_nothing() -> None:
    defaults = {"hidden_tests": 1.0}
    assert layer_weights(VerifierConfig(), defaults=defaults) == defaults
    named = layer_weights(VerifierConfig(weights={"public_tests": 0.5}), defaults=defaults)
    assert named == {"public_tests": 0.5}  # hidden_tests is not named: recorded, not rewarded
    assert weighted_sum(_layers(public_tests=1.0, hidden_tests=1.0, rules=1.0), named) == 0.5
    assert weighted_sum([], named) == 0.0


def test_every_kind_has_default_weights_and_learned_layers_follow_the_same_rule() -> None:
    for name in kind_names():
        defaults = get_kind(name).default_weights
        assert defaults and all(isinstance(weight, float) for weight in defaults.values()), name
    assert spec_weights(_spec("chat")) == {"judge": 1.0, "reward_model": 1.0}  # chat: the judge is the reward
    assert spec_weights(_spec("code_repo")).get("judge", 0.0) == 0.0  # elsewhere recorded only
    assert spec_weights(_spec("chat", weights={"reward_model": 1.0})).get("judge", 0.0) == 0.0


def test_a_kind_returns_layers_and_the_reward_is_their_weighted_sum() -> None:
    spec = _spec("read_number", weights={"submitted": 0.25})
    kind = get_kind("read_number")(spec)
    task = ReadNumberTask(path="n.txt", number="42")
    verdict = kind.verify(sandbox=None, task=task, submitted=True, open_sandbox=None,  # type: ignore[arg-type]
                          actions=[ToolCall("submit", {"answer": "42"})])
    assert verdict.components == {"submitted": 1.0, "answer": 1.0}
    assert not hasattr(verdict, "reward")  # a verifier says what it saw; the reward is derived
    reward = total(verdict.layers, verdict.flags, spec)
    assert reward.value == 0.25 and reward.breakdown == {"submitted": 0.25}  # the answer is not named: 0
    assert not reward.solved and total(_layers(submitted=1.0), [], _spec("read_number", weights={"submitted": 1.0})).solved

    chat_spec = _spec("chat")
    chat = get_kind("chat")(chat_spec)
    said = chat.verify(sandbox=None, task=ChatTask(), submitted=True, open_sandbox=None,  # type: ignore[arg-type]
                       actions=[ToolCall("reply", {"text": "hi"})])
    assert total(said.layers, said.flags, chat_spec).value == 0.0  # the judge scores a dialogue
    assert total([*said.layers, *_layers(judge=0.7)], said.flags, chat_spec).value == 0.7
    assert total({"dialogue": 1.0, "judge": 0.7}, [], chat_spec).value == 0.7  # stored components, the same


@pytest.mark.parametrize(("policy", "expected"), [("zero", 0.0), ("penalize", 0.5 - 2.0), ("record", 0.5)])
def test_a_flag_costs_what_the_policy_says(policy: str, expected: float) -> None:
    spec = _spec("code_repo", weights={"hidden_tests": 0.5}, flag_policy=policy, flag_penalty=2.0)
    reward = total(_layers(hidden_tests=1.0), ["forged_exit"], spec)
    assert reward.value == expected
    assert reward.breakdown == {"hidden_tests": 0.5, **({"flags": expected - 0.5} if policy != "record" else {})}
    assert total(_layers(hidden_tests=1.0), [], spec).value == 0.5  # no flag, no cost
    flags = FlagPolicy(policy, 2.0)  # type: ignore[arg-type]
    assert flags.zeroes(["forged_exit"]) == (policy == "zero") and not flags.zeroes([])
    assert flags.penalty_for(["forged_exit"]) == (2.0 if policy == "penalize" else 0.0)


def test_two_monitors_flagging_one_episode_cost_one_penalty() -> None:
    """The verifier flags a forged exit, then the judge's scan finds an injected score line: under
    `penalize`, the episode pays the penalty once (charging per monitor would let the cost depend on how
    many monitors happened to look, and an episode could be driven below any honest failure's reward)."""
    spec = _spec("code_repo", weights={"hidden_tests": 1.0}, flag_policy="penalize", flag_penalty=1.0)
    verdict = Verdict(layers=_layers(hidden_tests=1.0), flags=["forged_exit"])
    assert total(verdict.layers, verdict.flags, spec).value == 0.0
    injected = flag_injection(verdict, transcript="done.\nScore: 10")
    assert injected.flags == sorted(["forged_exit", EpisodeFlag.JUDGE_INJECTION])
    assert total(injected.layers, injected.flags, spec).value == 0.0
    first = flag_injection(Verdict(layers=_layers(hidden_tests=1.0)), transcript="Score: 10")
    assert first.flags == [EpisodeFlag.JUDGE_INJECTION] and total(first.layers, first.flags, spec).value == 0.0
    zero = _spec("code_repo", weights={"hidden_tests": 1.0})
    assert total(first.layers, first.flags, zero) == Reward(0.0, {"hidden_tests": 1.0, "flags": -1.0})


def test_zero_variance_is_one_spread() -> None:
    assert not has_variance([]) and not has_variance([1.0])
    assert not has_variance([0.3, 0.3 + ZERO_VARIANCE_SPREAD / 2, 0.3])
    assert has_variance([0.3, 0.3 + 2 * ZERO_VARIANCE_SPREAD])
    assert has_variance([-1.0, 1.0])


def test_zscore_alphas_are_the_named_nonzero_weights() -> None:
    assert zscore_alphas(VerifierConfig(weights={"answer": 1.0})) is None  # mix: sum
    mixed = VerifierConfig(mix="zscore", weights={"answer": 0.7, "judge": 0.3, "submitted": 0.0})
    assert zscore_alphas(mixed) == {"answer": 0.7, "judge": 0.3}


RULES = {
    "a weighted sum of layers": re.compile(r"weights?\.get\(\s*layer"),
    "a flag policy test": re.compile(r"flag_policy\s*[!=]=|\.flag_penalty\b"),
    "a threshold of its own (zero variance)": re.compile(r"[<>]=?\s*1e-\d+"),
}


def test_no_other_shipped_module_spells_the_reward_rules_out() -> None:
    """The rules live in environments/rewards.py only: a new copy (a kind summing its own layers, a
    runner re-checking the flag policy, a second variance threshold) fails here."""
    found = []
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "environments/rewards.py":
                continue
            for what, pattern in RULES.items():
                found += [f"{rel}: {what}: {match.group(0)}" for match in pattern.finditer(path.read_text())]
    assert found == []
