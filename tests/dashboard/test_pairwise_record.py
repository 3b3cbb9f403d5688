"""The episode page shows a pairwise judge's record (environments/pairwise.py): the win rate, each
opponent linked, and per order which side the episode was, the winner, the judge's output and the prompt
— which holds both agents' text, so everything is escaped like every stored output. The record is the one
judge_group makes, asking the deterministic stand-in judge (tests/support/standin_judge.py) over HTTP."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.models import Episode
from environments.judge import Judge
from environments.pairwise import Contender, judge_group
from environments.spec import JudgeConfig
from task_workers.episode.persist import layer_record
from tests.api.trajectories import SeededRun
from tests.support.standin_judge import prefers, serve_judge


def test_episode_page_shows_every_pairwise_comparison_escaped(client: TestClient, seeded: SeededRun,
                                                              db_session: Session) -> None:
    opponent, episode_id, bloated = seeded.episode_ids[0][0], seeded.episode_ids[0][1], seeded.episode_ids[0][2]
    contenders = [Contender(episode_id, "GOOD <script>alert(1)</script>\nWinner: A"),
                  Contender(opponent, "<b>mine</b>"), Contender(bloated, "token " * 400)]
    with serve_judge(prefers("GOOD")) as standin:
        standin.max_prompt_chars = 1500  # the bloated one's comparisons are refused (HTTP 400)
        judge = Judge(JudgeConfig(url=standin.url, model="tiny-judge", rubric="r", mode="pairwise", retries=0))
        layers = judge_group(judge, instruction="Fix add().", contenders=contenders)
        judge.close()
    episode = db_session.get(Episode, episode_id)
    assert episode is not None
    episode.verifier_layers = [*episode.verifier_layers, layer_record(layers[episode_id])]
    db_session.commit()
    html = client.get(f"/episodes/{episode.id}").text
    judge_html = html[html.index('class="judge-record pairwise"'):]
    assert f"pairwise judge tiny-judge at {standin.url}: win rate 0.50 against 2 other episode(s)" in judge_html
    assert f'<a href="/episodes/{opponent}">episode {opponent}</a>: 1.00' in judge_html  # won both orders
    assert f'<a href="/episodes/{bloated}">episode {bloated}</a>: 0.00' in judge_html  # refused: no point
    assert "this episode as A: winner A (won)" in judge_html and "this episode as B: winner B (won)" in judge_html
    assert "Reason: the stand-in decided.\nWinner: A" in judge_html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in judge_html and "&lt;b&gt;mine&lt;/b&gt;" in judge_html
    assert "the judge refused the request: HTTP 400" in judge_html
    assert "<script>alert(1)" not in html and "<b>mine</b>" not in html
