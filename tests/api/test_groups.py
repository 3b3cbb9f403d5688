"""GRPO groups: rewards, the advantages the trainer stored (none computed by the API), divergence,
degenerate flags."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from api.services.groups import divergence_turn
from core.models import Episode
from tests.api.trajectories import SeededRun


def test_show_group_puts_rollouts_side_by_side_with_advantages(client: TestClient, seeded: SeededRun) -> None:
    group = client.get(f"/v1/groups/{seeded.group_ids[0]}").json()
    assert (group["status"], group["consumed_step"], group["rewarded"], group["degenerate"]) == ("consumed", 1, 4, False)
    assert [r["sample_index"] for r in group["rollouts"]] == [0, 1, 2, 3]
    assert [r["reward"] for r in group["rollouts"]] == [1.0, 0.0, 0.5, 0.0]
    # The seeded group has no stored advantages: the API shows none rather than a formula of its own.
    assert [r["advantage"] for r in group["rollouts"]] == [None] * 4
    assert group["divergence_turn"] == 1  # every rollout starts with "run pytest"
    first = group["rollouts"][0]["turns"]
    assert [(t["index"], t["tool"], t["exit_code"]) for t in first] == [(0, "run", 0), (1, "edit", 0), (2, "submit", 0)]


def test_a_group_where_every_reward_is_equal_is_degenerate(client: TestClient, seeded: SeededRun) -> None:
    group = client.get(f"/v1/groups/{seeded.group_ids[1]}").json()
    assert group["degenerate"] is True and group["reward_std"] == 0
    assert [r["advantage"] for r in group["rollouts"]] == [None] * 4  # dropped, never trained on
    assert group["divergence_turn"] is None  # identical rollouts


def test_a_running_group_has_no_advantages_yet(client: TestClient, seeded: SeededRun) -> None:
    group = client.get(f"/v1/groups/{seeded.group_ids[2]}").json()
    assert group["degenerate"] is False and group["rewarded"] == 2
    assert [r["advantage"] for r in group["rollouts"]] == [None] * 4


def test_the_api_shows_the_stored_advantage_whatever_the_rewards_say(
    client: TestClient, seeded: SeededRun, db_session: Session
) -> None:
    """Values no formula over these rewards gives (old code recomputed (r − mean)/std and showed 1.508)."""
    group_id = seeded.group_ids[0]
    db_session.execute(update(Episode).where(Episode.group_id == group_id)
                       .values(advantage=Episode.sample_index * 0.25 - 7.0, trained_score=Episode.sample_index * 1.5))
    db_session.commit()
    rollouts = client.get(f"/v1/groups/{group_id}").json()["rollouts"]
    assert [r["advantage"] for r in rollouts] == [-7.0, -6.75, -6.5, -6.25]
    assert [r["trained_score"] for r in rollouts] == [0.0, 1.5, 3.0, 4.5]


def test_list_a_runs_groups_latest_first(client: TestClient, seeded: SeededRun) -> None:
    page = client.get(f"/v1/runs/{seeded.run_id}/groups?limit=2").json()
    assert [g["group_index"] for g in page["data"]] == [2, 1]
    assert [g["degenerate"] for g in page["data"]] == [False, True]
    rest = client.get(f"/v1/runs/{seeded.run_id}/groups?limit=2&cursor={page['next_cursor']}").json()
    assert [g["group_index"] for g in rest["data"]] == [0] and rest["next_cursor"] is None
    assert [g["id"] for g in client.get(f"/v1/runs/{seeded.run_id}/groups?status=consumed").json()["data"]] == [
        seeded.group_ids[0]]
    assert client.get("/v1/runs/999/groups").status_code == 404


def test_divergence_turn() -> None:
    def turns(*digests: str) -> list[dict[str, str]]:
        return [{"digest": d} for d in digests]
    assert divergence_turn([turns("a", "b"), turns("a", "c")]) == 1
    assert divergence_turn([turns("a", "b"), turns("a")]) == 1  # one rollout ended first
    assert divergence_turn([turns("a"), turns("a")]) is None
    assert divergence_turn([turns("a")]) is None
