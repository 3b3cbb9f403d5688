"""GRPO groups: rewards, group-relative advantages computed on the fly, divergence, degenerate flags."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.services.groups import advantages, divergence_turn
from tests.api.trajectories import SeededRun


def test_show_group_puts_rollouts_side_by_side_with_advantages(client: TestClient, seeded: SeededRun) -> None:
    group = client.get(f"/v1/groups/{seeded.group_ids[0]}").json()
    assert (group["status"], group["consumed_step"], group["rewarded"], group["degenerate"]) == ("consumed", 1, 4, False)
    assert [r["sample_index"] for r in group["rollouts"]] == [0, 1, 2, 3]
    assert [r["reward"] for r in group["rollouts"]] == [1.0, 0.0, 0.5, 0.0]
    assert [round(r["advantage"], 3) for r in group["rollouts"]] == [1.508, -0.905, 0.302, -0.905]
    assert group["divergence_turn"] == 1  # every rollout starts with "run pytest"
    first = group["rollouts"][0]["turns"]
    assert [(t["index"], t["tool"], t["exit_code"]) for t in first] == [(0, "run", 0), (1, "edit", 0), (2, "submit", 0)]


def test_a_group_where_every_reward_is_equal_is_degenerate(client: TestClient, seeded: SeededRun) -> None:
    group = client.get(f"/v1/groups/{seeded.group_ids[1]}").json()
    assert group["degenerate"] is True and group["reward_std"] == 0
    assert [r["advantage"] for r in group["rollouts"]] == [0.0, 0.0, 0.0, 0.0]
    assert group["divergence_turn"] is None  # identical rollouts


def test_a_running_group_scores_only_its_rewarded_rollouts(client: TestClient, seeded: SeededRun) -> None:
    group = client.get(f"/v1/groups/{seeded.group_ids[2]}").json()
    assert group["degenerate"] is False and group["rewarded"] == 2
    assert [None if a is None else round(a, 3) for a in (r["advantage"] for r in group["rollouts"])] == [1.0, -1.0, None, None]


def test_list_a_runs_groups_latest_first(client: TestClient, seeded: SeededRun) -> None:
    page = client.get(f"/v1/runs/{seeded.run_id}/groups?limit=2").json()
    assert [g["group_index"] for g in page["data"]] == [2, 1]
    assert [g["degenerate"] for g in page["data"]] == [False, True]
    rest = client.get(f"/v1/runs/{seeded.run_id}/groups?limit=2&cursor={page['next_cursor']}").json()
    assert [g["group_index"] for g in rest["data"]] == [0] and rest["next_cursor"] is None
    assert [g["id"] for g in client.get(f"/v1/runs/{seeded.run_id}/groups?status=consumed").json()["data"]] == [
        seeded.group_ids[0]]
    assert client.get("/v1/runs/999/groups").status_code == 404


@pytest.mark.parametrize(("rewards", "expected"), [
    ([1.0, 0.0], [1.0, -1.0]),
    ([0.5, 0.5, 0.5], [0.0, 0.0, 0.0]),
    ([None, 1.0, 0.0], [None, 1.0, -1.0]),
    ([None], [None]),
])
def test_advantages(rewards: list[float | None], expected: list[float | None]) -> None:
    got = advantages(rewards)
    assert [None if a is None else round(a, 4) for a in got] == expected


def test_divergence_turn() -> None:
    def turns(*digests: str) -> list[dict[str, str]]:
        return [{"digest": d} for d in digests]
    assert divergence_turn([turns("a", "b"), turns("a", "c")]) == 1
    assert divergence_turn([turns("a", "b"), turns("a")]) == 1  # one rollout ended first
    assert divergence_turn([turns("a"), turns("a")]) is None
    assert divergence_turn([turns("a")]) is None
