"""(issue 24) A group judged pairwise: while its judge has not scored it, its ended episodes read as
awaiting judging — no reward in the API, "awaiting judge" on the dashboard, "judging" in the CLI — and
their rewards appear once the judge's scores are stored. Before, they read `completed` with the tests'
reward alone, which changed later with nothing saying it was provisional."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from cli.episodes import _reward
from task_workers.episode.group_judge import judge_finished_group
from tests.support.pairwise_groups import end_episode, make_group
from tests.support.standin_judge import prefers, serve_judge


def test_a_pairwise_groups_episodes_await_the_judge_then_show_its_reward(client: TestClient, db_session: Session) -> None:
    with serve_judge(prefers("GOOD")) as judge:
        group_id, ids = make_group(db_session, judge_url=judge.url, size=2)
        judge.down = True  # the group has ended, its judge not yet answered
        for index, episode_id in enumerate(ids):
            end_episode(db_session, episode_id, text=f"sample-{index} {'GOOD' if index == 0 else 'bad'}", reward=1.0)
        listed = client.get("/v1/episodes", params={"group_id": group_id}).json()["data"]
        shown = client.get(f"/v1/episodes/{ids[0]}").json()
        assert [(e["status"], e["awaiting_judging"], e["reward"], e["reward_components"]) for e in listed] == [
            ("completed", True, None, {})] * 2
        assert (shown["awaiting_judging"], shown["reward"]) == (True, None)
        page = client.get(f"/groups/{group_id}").text
        assert page.count("awaiting judge") >= 2 and "reward <b>1" not in page
        assert "awaiting judge" in client.get(f"/episodes/{ids[0]}").text
        assert _reward(listed[0]["reward"], awaiting=listed[0]["awaiting_judging"]) == "judging"

        judge.down = False
        assert judge_finished_group(group_id)
    listed = client.get("/v1/episodes", params={"group_id": group_id}).json()["data"]
    by_id = {e["id"]: e for e in listed}
    assert not any(e["awaiting_judging"] for e in listed)
    assert by_id[ids[0]]["reward"] > by_id[ids[1]]["reward"] and "judge" in by_id[ids[0]]["reward_components"]
    assert "awaiting judge" not in client.get(f"/groups/{group_id}").text


def test_an_episode_whose_pointwise_judge_did_not_answer_reads_as_awaiting_judging_until_it_is_judged(
        client: TestClient, db_session: Session) -> None:
    """(issue 50) Stored `scoring` (its judge did not answer): the API gives no reward, the CLI says
    "judging", the dashboard "awaiting judge", the trainer cannot claim its group; once judged from the
    store (task_workers/episode/learned.py) it is completed with the judge's layer, its group claimable."""
    from core.termination import TerminationReason
    from task_workers.episode.learned import rescore_stored
    from task_workers.episode.persist import Unscored
    from tests.support.pairwise_groups import claimable
    from tests.support.standin_judge import scores

    with serve_judge(scores(7)) as judge:
        group_id, ids = make_group(db_session, judge_url=judge.url, size=2, mode="pointwise")
        for index, episode_id in enumerate(ids):
            end_episode(db_session, episode_id, text=f"sample-{index}", reward=1.0, unscored=Unscored(
                reason=TerminationReason.JUDGE_ERROR, message="judge did not answer after 1 tries", worker="w"))
        listed = client.get("/v1/episodes", params={"group_id": group_id}).json()["data"]
        assert [(e["status"], e["termination_reason"], e["awaiting_judging"], e["reward"]) for e in listed] == [
            ("scoring", "submitted", True, None)] * 2
        assert client.get("/v1/episodes", params={"status": "scoring", "group_id": group_id}).json()["data"]
        assert _reward(listed[0]["reward"], awaiting=listed[0]["awaiting_judging"]) == "judging"
        assert "awaiting judge" in client.get(f"/episodes/{ids[0]}").text
        assert not claimable(db_session, group_id)
        assert [rescore_stored(episode_id, worker="w") for episode_id in ids] == [True, True]
        assert rescore_stored(ids[0], worker="w") is False  # scored: never twice
    listed = client.get("/v1/episodes", params={"group_id": group_id}).json()["data"]
    assert [(e["status"], e["awaiting_judging"], e["reward_components"].get("judge")) for e in listed] == [
        ("completed", False, 0.7)] * 2
    assert claimable(db_session, group_id)
