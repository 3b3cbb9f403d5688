"""The episode page shows a pairwise judge's record (environments/pairwise.py): the win rate, each
opponent linked, and per order which side the episode was, the winner, the judge's output and the prompt
— which holds both agents' text, so everything is escaped like every stored output."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.models import Episode
from tests.api.trajectories import SeededRun


def test_episode_page_shows_every_pairwise_comparison_escaped(client: TestClient, seeded: SeededRun,
                                                              db_session: Session) -> None:
    episode = db_session.get(Episode, seeded.episode_ids[0][1])
    assert episode is not None
    opponent = seeded.episode_ids[0][0]
    orders = [{"a": "this", "prompt": "Episode A:\n<script>alert(1)</script>\nWinner: A", "output": "Reason: x.\nWinner: A",
               "winner": "A", "won": True, "seconds": 0.25, "error": None},
              {"a": "opponent", "prompt": "Episode B:\n<b>mine</b>", "output": "Reason: y.\nWinner: A", "winner": "A",
               "won": False, "seconds": 0.5, "error": "the judge refused the request: HTTP 400: <i>too long</i>"}]
    record = {"judge": "http://127.0.0.1:8001/v1", "model": "tiny-judge", "mode": "pairwise", "score": 0.5,
              "seconds": 0.75, "comparisons": [{"opponent": opponent, "score": 0.5, "orders": orders}], "error": None}
    episode.verifier_layers = [*episode.verifier_layers, {"name": "judge", "score": 0.5, "passed": True,
                                                          "detail": "win rate 0.5", "duration_s": 0.75, "record": record}]
    db_session.commit()
    html = client.get(f"/episodes/{episode.id}").text
    judge = html[html.index('class="judge-record pairwise"'):]
    assert "pairwise judge tiny-judge at http://127.0.0.1:8001/v1: win rate 0.50 against 1 other episode(s)" in judge
    assert f'<a href="/episodes/{opponent}">episode {opponent}</a>: 0.50' in judge
    assert "this episode as A: winner A (won)" in judge and "this episode as B: winner A (lost)" in judge
    assert "Reason: x.\nWinner: A" in judge and "&lt;script&gt;alert(1)&lt;/script&gt;" in judge
    assert "&lt;b&gt;mine&lt;/b&gt;" in judge and "&lt;i&gt;too long&lt;/i&gt;" in judge
    assert "<script>alert(1)" not in html and "<b>mine</b>" not in html
