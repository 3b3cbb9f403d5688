"""GenRM-style pairwise judging within a GRPO group (`verifier.judge.mode: pairwise`).

    layers = judge_group(judge, instruction=task.instruction, contenders=[Contender(id, transcript), …])
    # {episode_id: LayerResult "judge"}: its score is the episode's mean win rate against the others

An episode alone cannot be scored pairwise: a group's episodes are compared once they have all ended
(task_workers/episode/group_judge.py does it before the group becomes claimable). Every unordered pair is
asked in both orders (Judge.pairwise: A=first then A=second), so the judge's position bias cancels — and
so does an agent's own "Winner: A" in its transcript: it sits inside a fence whose nonce the agent never
sees, only the judge's output is parsed, and in the other order the same line names its opponent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from sqlalchemy import Select, select

from core.models import Environment
from environments.base import LayerResult
from environments.judge import LAYER, Judge, PairVerdict

CONCURRENT_PAIRS = 8
"""Pairs asked at once: a vLLM judge batches concurrent requests (G=8 is 28 pairs, 56 completions)."""
TIE = 0.5


@dataclass(frozen=True)
class Contender:
    episode_id: int
    transcript: str


def pairwise_environments() -> Select[Any]:
    """The ids of environment versions whose judge compares a group's episodes pairwise: their groups are
    completed by the pairwise judging, never by the store or the reconciler directly."""
    return select(Environment.id).where(Environment.spec["verifier"]["judge"]["mode"].astext == "pairwise")


def win_rates(scores: Mapping[tuple[int, int], float | None], *, episode_ids: Sequence[int]) -> dict[int, float]:
    """Each episode's mean score over its comparisons. `scores[(i, j)]` is i's score against j (1: i won
    both orders, 0.5: a split or a tie, 0: j won both) and j scores 1 minus it; a comparison neither order
    parsed counts as a tie. An episode compared with no other scores a tie."""
    results: dict[int, list[float]] = {episode_id: [] for episode_id in episode_ids}
    for (first, second), score in scores.items():
        first_score = TIE if score is None else score
        results[first].append(first_score)
        results[second].append(1.0 - first_score)
    return {episode_id: sum(got) / len(got) if got else TIE for episode_id, got in results.items()}


def judge_group(judge: Judge, *, instruction: str, contenders: Sequence[Contender]) -> dict[int, LayerResult]:
    """Every pair of `contenders` compared in both orders; each one's `judge` layer (score: mean win rate)
    with every comparison in its record. JudgeUnavailable (from any pair) propagates: nothing is scored."""
    pairs = list(combinations(contenders, 2))

    def ask(pair: tuple[Contender, Contender]) -> PairVerdict:
        first, second = pair
        return judge.pairwise(instruction=instruction, first=first.transcript, second=second.transcript)

    with ThreadPoolExecutor(max_workers=max(1, min(CONCURRENT_PAIRS, len(pairs)))) as pool:
        answers = list(pool.map(ask, pairs))
    verdicts = {(first.episode_id, second.episode_id): verdict
                for (first, second), verdict in zip(pairs, answers, strict=True)}
    rates = win_rates({pair: verdict.score for pair, verdict in verdicts.items()},
                      episode_ids=[contender.episode_id for contender in contenders])
    return {c.episode_id: _layer(judge, c.episode_id, rates[c.episode_id], verdicts) for c in contenders}


def _layer(judge: Judge, episode_id: int, rate: float, verdicts: Mapping[tuple[int, int], PairVerdict]) -> LayerResult:
    comparisons = [_comparison(episode_id, pair, verdict) for pair, verdict in verdicts.items() if episode_id in pair]
    seconds = sum(order["seconds"] for comparison in comparisons for order in comparison["orders"])
    record = {"judge": judge.server, "model": judge.config.model, "mode": "pairwise", "score": rate,
              "seconds": round(seconds, 4), "comparisons": comparisons, "error": None}
    if not comparisons:
        detail = "not compared: no other judged episode in the group (a tie by default)"
    else:
        scores = [comparison["score"] for comparison in comparisons]
        won, lost = sum(score == 1 for score in scores), sum(score == 0 for score in scores)
        detail = (f"win rate {rate:.3g} against {len(comparisons)} other episode(s), both orders asked: {won} won, "
                  f"{lost} lost, {len(scores) - won - lost} split or tied")
    return LayerResult(name=LAYER, score=rate, passed=rate >= judge.config.pass_threshold, detail=detail,
                       duration_s=seconds, record=record)


def _comparison(episode_id: int, pair: tuple[int, int], verdict: PairVerdict) -> dict[str, Any]:
    """One pair's verdict as `episode_id` sees it: its opponent, its score, and each order with which of the
    two was A and whether it won."""
    is_first = pair[0] == episode_id
    score = verdict.score if verdict.score is None or is_first else 1.0 - verdict.score
    orders = []
    for order in verdict.orders:
        this_was_a = (order["a"] == "first") == is_first
        won = None if order["first_won"] is None else order["first_won"] == is_first
        orders.append({"a": "this" if this_was_a else "opponent", "prompt": order["prompt"], "output": order["output"],
                       "winner": order["winner"], "won": won, "seconds": order["seconds"],
                       "error": order.get("error")})
    return {"opponent": pair[1] if is_first else pair[0], "score": TIE if score is None else score, "orders": orders}
