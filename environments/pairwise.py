"""GenRM-style pairwise judging within a GRPO group (`verifier.judge.mode: pairwise`).

    layers = judge_group(judge, instruction=task.instruction, contenders=[Contender(id, transcript), …])
    # {episode_id: LayerResult "judge"}: its score is the episode's mean win rate against the others

An episode alone cannot be scored pairwise: a group's episodes are compared once they have all ended
(task_workers/episode/group_judge.py does it before the group becomes claimable). Every unordered pair is
asked in both orders (Judge.pairwise: A=first then A=second), so the judge's position bias cancels. Each
comparison hands out one point between its two episodes — none if the judge refused it (a prompt over its
context): an episode made too long to judge scores 0 against everyone, never a tie.

An agent's own "Winner: A" or "Score: 10" in its transcript sits inside a fence whose nonce it never sees,
and only the judge's output is parsed; but a judge can still be swayed by it (a line naming the gamer as
A in one order and as B in the other does not cancel a judge swayed by it: it turns a loss into a split).
Such a transcript is flagged by the runner (core.flags.EpisodeFlag.JUDGE_INJECTION) and `flag_policy`
says what it costs; under `zero` (the default) it is not compared at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from sqlalchemy import Select, select

from core.models import Environment
from environments.base import LayerResult
from environments.judge import LAYER, Judge, PairVerdict

logger = logging.getLogger(__name__)

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


def win_rates(points: Mapping[tuple[int, int], tuple[float, float]], *, episode_ids: Sequence[int]) -> dict[int, float]:
    """Each episode's mean points over its comparisons. `points[(i, j)]` is (i's points, j's points) in their
    comparison (PairVerdict.points: 1 between them — 1/0 both orders won, 0.5/0.5 a split or a tie — or
    0/0 when the judge refused it). An episode compared with no other scores a tie."""
    results: dict[int, list[float]] = {episode_id: [] for episode_id in episode_ids}
    for (first, second), (first_points, second_points) in points.items():
        results[first].append(first_points)
        results[second].append(second_points)
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
    if verdicts and all(verdict.refused is not None for verdict in verdicts.values()):
        logger.warning("judge %s (%s) refused every comparison of the group (episodes %s): a configuration fault "
                       "(max_transcript_chars over the judge's context?); every episode scores 0. First refusal: %s",
                       judge.server, judge.config.model, [c.episode_id for c in contenders],
                       next(iter(verdicts.values())).refused)
    rates = win_rates({pair: verdict.points for pair, verdict in verdicts.items()},
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
        refused = sum(c["refused"] is not None for c in comparisons)
        won = sum(c["score"] == 1 for c in comparisons)
        lost = sum(c["score"] == 0 and c["refused"] is None for c in comparisons)
        detail = (f"win rate {rate:.3g} against {len(comparisons)} other episode(s), both orders asked: {won} won, "
                  f"{lost} lost, {len(comparisons) - won - lost - refused} split or tied, {refused} refused by the "
                  "judge (no point to either)")
    return LayerResult(name=LAYER, score=rate, passed=rate >= judge.config.pass_threshold, detail=detail,
                       duration_s=seconds, record=record)


def _comparison(episode_id: int, pair: tuple[int, int], verdict: PairVerdict) -> dict[str, Any]:
    """One pair's verdict as `episode_id` sees it: its opponent, its score, and each order with which of the
    two was A and whether it won."""
    is_first = pair[0] == episode_id
    score = verdict.points[0 if is_first else 1]
    orders = []
    for order in verdict.orders:
        this_was_a = (order["a"] == "first") == is_first
        won = None if order["first_won"] is None else order["first_won"] == is_first
        orders.append({"a": "this" if this_was_a else "opponent", "prompt": order["prompt"], "output": order["output"],
                       "winner": order["winner"], "won": won, "seconds": order["seconds"],
                       "error": order.get("error")})
    return {"opponent": pair[1] if is_first else pair[0], "score": score, "refused": verdict.refused,
            "orders": orders}
