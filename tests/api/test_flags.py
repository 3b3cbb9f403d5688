"""Hack-monitor flags end to end on the read side: stored on the episode, filtered by the API, shown on
the episode, group, episodes and run pages, counted in the run summary and the trainer's metrics."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from core.models import Episode
from tests.api.trajectories import SeededRun
from trainer import metrics
from trainer.rollouts import Sample
from trainer.selection import BatchPlan


def _flag(session: Session, episode_id: int, flags: list[str]) -> None:
    session.execute(update(Episode).where(Episode.id == episode_id).values(flags=flags))
    session.commit()


def test_episodes_filter_by_flag_and_summaries_carry_flags(client: TestClient, db_session: Session,
                                                          seeded: SeededRun) -> None:
    forged, shadowed = seeded.episode_ids[0][0], seeded.episode_ids[0][1]
    _flag(db_session, forged, ["forged_exit", "protected_paths"])
    _flag(db_session, shadowed, ["runner_shadowing"])
    rows = client.get("/v1/episodes", params={"flag": "forged_exit", "limit": 500}).json()["data"]
    assert [row["id"] for row in rows] == [forged] and rows[0]["flags"] == ["forged_exit", "protected_paths"]
    assert client.get("/v1/episodes", params={"flag": "tests_skipped"}).json()["data"] == []
    assert client.get(f"/v1/episodes/{shadowed}").json()["flags"] == ["runner_shadowing"]
    bad = client.get("/v1/episodes", params={"flag": "'; drop table episodes; --"})
    assert bad.status_code == 422 and "forged_exit" in bad.text  # names what is expected


def test_the_run_summary_counts_flagged_episodes(client: TestClient, db_session: Session, seeded: SeededRun) -> None:
    _flag(db_session, seeded.episode_ids[0][0], ["forged_exit"])
    _flag(db_session, seeded.episode_ids[0][1], ["forged_exit", "tests_deleted"])
    summary = client.get(f"/v1/runs/{seeded.run_id}").json()["summary"]
    completed = summary["episodes"]["completed"]
    assert summary["flagged"] == 2 and summary["flagged_rate"] == 2 / completed
    assert summary["flags"] == {"forged_exit": 2, "tests_deleted": 1}


def test_pages_show_flags(client: TestClient, db_session: Session, seeded: SeededRun) -> None:
    episode_id = seeded.episode_ids[0][0]
    _flag(db_session, episode_id, ["result_forging"])
    episode_page = client.get(f"/episodes/{episode_id}").text
    assert 'id="episode-flags"' in episode_page and "result_forging" in episode_page
    assert "result_forging" in client.get(f"/groups/{seeded.group_ids[0]}").text
    run_page = client.get(f"/runs/{seeded.run_id}").text
    assert 'id="sum-flagged"' in run_page and f"/episodes?run_id={seeded.run_id}&amp;flag=result_forging" in run_page
    listing = client.get("/episodes", params={"flag": "result_forging"}).text
    assert f'href="/episodes/{episode_id}"' in listing and "<option selected>result_forging</option>" in listing


def _sample(index: int, flags: tuple[str, ...]) -> Sample:
    return Sample(episode_id=index, group_id=1, environment="code", status="completed", termination="submitted",
                  reward=0.0, components={}, policy_version=0, token_ids=[1], loss_mask=[1], behaviour_logprobs=[0.0],
                  flags=flags)


def test_the_trainer_reports_the_flagged_rate() -> None:
    scored = [_sample(1, ("forged_exit",)), _sample(2, ()), _sample(3, ("forged_exit", "tests_deleted")), _sample(4, ())]
    plan = BatchPlan(scored=scored, examined=1)
    out = metrics.batch_metrics(plan)
    assert out[metrics.FLAGGED] == 0.5
    assert out["rollout/flagged/forged_exit"] == 0.5 and out["rollout/flagged/tests_deleted"] == 0.25
