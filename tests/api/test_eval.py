"""`GET /v1/runs/{id}/eval`: an eval run's pass@1 and pass@k with their intervals, counting the agent's
own outcomes only (a sandbox fault is excluded, an unfinished episode said so), by environment and bucket."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.stats import pass_at_k
from tests.support.eval_runs import seed_eval_run


def test_the_report_counts_what_the_policy_did(client: TestClient, db_session: Session) -> None:
    run = seed_eval_run(db_session, name="eval-api", outcomes=[
        [1.0, 1.0, 0.0],          # 2/3
        [0.0, "failed", 0.0],     # 0/2: the fault is excluded, not a failure
        [1.0, 0.999, 0.5],        # 1/3: 0.999 is not full reward
        [1.0, "running", 1.0],    # 2/2 so far
    ], difficulty=["easy", "hard", None, "easy"])
    response = client.get(f"/v1/runs/{run.id}/eval")
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["purpose"], report["k"], report["split"], report["unfinished"]) == ("eval", 3, "test", 1)
    overall = report["overall"]
    assert (overall["tasks"], overall["episodes"], overall["solved"], overall["excluded"]) == (4, 10, 5, 1)
    assert overall["pass_at_1"]["value"] == pytest.approx((2 / 3 + 0 + 1 / 3 + 1) / 4, abs=1e-6)
    # pass@3 only over the tasks with 3 counted episodes: the first and the third
    assert overall["pass_at_k"]["tasks"] == 2
    assert overall["pass_at_k"]["value"] == pytest.approx((pass_at_k(3, 2, 3) + pass_at_k(3, 1, 3)) / 2, abs=1e-6)
    low, value, high = overall["pass_at_1"]["low"], overall["pass_at_1"]["value"], overall["pass_at_1"]["high"]
    assert 0.0 <= low < value < high <= 1.0
    assert list(report["by_environment"]) == ["eval-api"]
    assert set(report["by_bucket"]) == {"easy", "hard", "unknown"}
    assert report["by_bucket"]["easy"]["solved"] == 4 and report["by_bucket"]["hard"]["pass_at_1"]["value"] == 0.0
    assert "bootstrap over tasks" in report["method"]


def test_no_episode_yet_is_an_empty_report_not_an_error(client: TestClient, db_session: Session) -> None:
    run = seed_eval_run(db_session, name="eval-empty", outcomes=[["running", "running"]])
    report = client.get(f"/v1/runs/{run.id}/eval").json()
    assert report["overall"] == {"tasks": 0, "episodes": 0, "solved": 0, "excluded": 0, "pass_at_1": None,
                                 "pass_at_k": None}
    assert report["unfinished"] == 2


@pytest.mark.parametrize(("path", "status"), [("/v1/runs/999999999/eval", 404), ("/v1/runs/-1/eval", 422),
                                              ("/v1/runs/1e9/eval", 422), ("/v1/runs/99999999999999999999/eval", 422)])
def test_a_run_that_is_not_there(client: TestClient, path: str, status: int) -> None:
    response = client.get(path)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"}


def test_the_report_needs_a_token(anonymous: TestClient, db_session: Session) -> None:
    run = seed_eval_run(db_session, name="eval-anon", outcomes=[[1.0]])
    response = anonymous.get(f"/v1/runs/{run.id}/eval")
    assert response.status_code == 401 and "pass_at_1" not in response.text
