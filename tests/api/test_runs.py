"""`/v1/runs`: launch from a RunConfig, list, show with summary counts, stop/resume, metrics, stats."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from api.services import run_stats
from core.models import EpisodeGroup, Run
from tests import factories
from tests.api.trajectories import SeededRun


def _environment_with_tasks(db_session: Session, name: str = "calc") -> None:
    env = factories.environment(db_session, name=name)
    factories.task(db_session, env)
    db_session.commit()


def test_launch_pins_versions_and_starts_pending(client: TestClient, db_session: Session) -> None:
    _environment_with_tasks(db_session)
    response = client.post("/v1/runs", json={"name": "r1", "model": "tiny", "environments": [{"name": "calc"}],
                                              "group_size": 4, "mode": "sync"})
    assert response.status_code == 201, response.text
    run = response.json()
    assert (run["status"], run["group_size"], run["max_staleness"]) == ("pending", 4, 0)
    shown = client.get(f"/v1/runs/{run['id']}").json()
    assert shown["environments"] == [{"environment_id": 1, "name": "calc", "version": 1, "weight": 1.0}]
    assert shown["config"]["environments"] == [{"name": "calc", "version": 1, "weight": 1.0}]


def test_launch_errors_are_422_or_409_with_the_reason(client: TestClient, db_session: Session) -> None:
    _environment_with_tasks(db_session)
    config = {"name": "r1", "model": "tiny", "environments": [{"name": "calc"}]}
    assert client.post("/v1/runs", json=config).status_code == 201
    taken = client.post("/v1/runs", json=config)
    assert taken.status_code == 422 and "a run named 'r1' exists (id 1)" in taken.json()["error"]["message"]
    unknown = client.post("/v1/runs", json={**config, "name": "r2", "environments": [{"name": "ghost"}]})
    assert unknown.status_code == 422 and "environments: no environment named 'ghost'" in unknown.json()["error"]["message"]
    empty_split = client.post("/v1/runs", json={**config, "name": "r3", "split": "test"})
    assert empty_split.status_code == 409 and empty_split.json()["error"]["code"] == "no_eligible_task"


def test_list_filters_and_pages_newest_first(client: TestClient, db_session: Session) -> None:
    for n in range(3):
        factories.run(db_session, name=f"run-{n}", status="running" if n != 1 else "stopped")
    db_session.commit()
    first = client.get("/v1/runs?limit=2").json()
    assert [run["name"] for run in first["data"]] == ["run-2", "run-1"]
    rest = client.get(f"/v1/runs?limit=2&cursor={first['next_cursor']}").json()
    assert [run["name"] for run in rest["data"]] == ["run-0"] and rest["next_cursor"] is None
    assert [run["name"] for run in client.get("/v1/runs?status=stopped").json()["data"]] == ["run-1"]


def test_show_has_summary_counts(client: TestClient, seeded: SeededRun) -> None:
    summary = client.get(f"/v1/runs/{seeded.run_id}").json()["summary"]
    assert summary["episodes"] == {"completed": 10, "running": 2}
    assert summary["groups"] == {"consumed": 1, "complete": 1, "running": 1}
    assert summary["termination"] == {"submitted": 3, "max_turns": 6, "format_error": 1}
    assert summary["reward_mean"] == 0.25  # (1 + 0.5 + 1) / 10
    assert (summary["training_steps"], summary["latest_step"]) == (2, 2)
    assert summary["turns"] == 29


def test_stop_and_resume_are_idempotent_and_guarded(client: TestClient, db_session: Session, seeded: SeededRun) -> None:
    stopped = client.post(f"/v1/runs/{seeded.run_id}/stop")
    assert stopped.status_code == 200 and stopped.json()["status"] == "stopped"
    assert client.post(f"/v1/runs/{seeded.run_id}/stop").json()["status"] == "stopped"
    assert client.post(f"/v1/runs/{seeded.run_id}/resume").json()["status"] == "running"  # it had started
    db_session.execute(update(Run).values(status="completed"))
    db_session.commit()
    response = client.post(f"/v1/runs/{seeded.run_id}/resume")
    assert response.status_code == 409
    assert response.json()["error"] == {"code": "conflict", "detail": None,
                                        "message": f"run {seeded.run_id} is completed; only a stopped run can be resumed"}


def test_metrics_aggregate_episodes_by_training_step(client: TestClient, seeded: SeededRun) -> None:
    metrics = client.get(f"/v1/runs/{seeded.run_id}/metrics").json()
    assert metrics["axis"] == "step"
    assert [(s["step"], s["metrics"]["loss/policy"]) for s in metrics["steps"]] == [(1, 0.5), (2, 0.3)]
    assert (metrics["stride"], metrics["total_steps"]) == (1, 2)
    (point,) = metrics["points"]  # only the first group has been trained on (at step 1)
    assert (point["x"], point["episodes"], point["reward_mean"], point["reward_min"], point["reward_max"]) == (1, 4, 0.375, 0, 1)
    assert point["by_environment"] == {"code-fix": 0.375}
    assert point["termination"] == {"submitted": 2, "max_turns": 1, "format_error": 1}
    assert point["components"] == {"format": 0.75, "hidden_tests": 0.375}


def test_metrics_fall_back_to_policy_versions_before_any_training(
    client: TestClient, db_session: Session, seeded: SeededRun
) -> None:
    db_session.execute(update(EpisodeGroup).values(consumed_step=None))
    db_session.commit()
    metrics = client.get(f"/v1/runs/{seeded.run_id}/metrics").json()
    assert metrics["axis"] == "version"
    by_x = {p["x"]: p for p in metrics["points"]}
    assert sorted(by_x) == [0, 1] and by_x[0]["episodes"] == 8 and by_x[1]["episodes"] == 2
    assert by_x[0]["by_environment"] == {"code-fix": 0.375, "web-nav": 0.0}


def test_stats_staleness_throughput_and_time_split(client: TestClient, seeded: SeededRun) -> None:
    stats = client.get(f"/v1/runs/{seeded.run_id}/stats").json()
    # trained at step 1 (the weights of version 0, which it turned into 1) from version 0 → 0; untrained:
    # the current version 2 would train them, − 0 or − 1
    assert stats["staleness"] == [{"staleness": 0, "episodes": 4}, {"staleness": 1, "episodes": 2},
                                  {"staleness": 2, "episodes": 4}]
    assert [point["episodes"] for point in stats["throughput"]] == [4, 4, 2]
    # training time: the steps that trained on the window's groups (step 1, 3 s; step 2 trained on none)
    assert stats["time_split"] == {"generation": 15.0, "sandbox": 20.0, "verify": 5.0, "training/train": 3.0}


def test_stats_cover_a_window_of_the_latest_groups(
    client: TestClient, seeded: SeededRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_stats, "WINDOW_GROUPS", 1)
    stats = client.get(f"/v1/runs/{seeded.run_id}/stats").json()
    assert stats["staleness"] == [{"staleness": 1, "episodes": 2}]  # the running group: 2 ended rollouts
    assert stats["time_split"]["generation"] == 3.0
    assert "training/train" not in stats["time_split"]  # no step has trained on the running group yet


def test_staleness_names_why_groups_were_dropped_and_how_far_behind_training_was(
    client: TestClient, db_session: Session, seeded: SeededRun,
) -> None:
    """Issue 23: every dropped group's reason (one dropped before reasons were stored: `unknown`), the
    trained tokens' lags summed over the steps, the masked fraction, and the length-bias check; hostile
    metric values (a non-numeric lag key, a string count) are skipped, not a 500."""
    from core.models import TrainingStep

    _, complete, _ = seeded.group_ids
    db_session.execute(update(EpisodeGroup).where(EpisodeGroup.id == complete)
                       .values(status="dropped", drop_reason="zero_variance", dropped_step=1))
    db_session.add(EpisodeGroup(run_id=seeded.run_id, group_index=9, task_id=db_session.get(EpisodeGroup, complete)
                                .task_id, environment_id=seeded.environment_ids[0], size=4, policy_version=0,
                                status="dropped"))
    steps = {s.step: s for s in db_session.query(TrainingStep).filter(TrainingStep.run_id == seeded.run_id)}
    steps[1].metrics = {**steps[1].metrics, "policy/token_lag/hist/0": 30, "policy/token_lag/hist/5": 10,
                        "policy/token_lag/masked_frac": 0.25, "batch/sampled_tokens": 40,
                        "policy/token_lag/max_weighted": 4, "policy/token_lag/hist/abc": 7}
    steps[2].metrics = {**steps[2].metrics, "policy/token_lag/hist/0": "many", "policy/token_lag/masked_frac": 0.5,
                        "batch/sampled_tokens": "lots"}
    db_session.commit()
    found = client.get(f"/v1/runs/{seeded.run_id}/staleness").json()
    assert found["dropped"] == {"unknown": 1, "zero_variance": 1}
    assert found["token_lags"] == [{"lag": 0, "tokens": 30}, {"lag": 5, "tokens": 10}]
    assert found["masked_token_frac"] == pytest.approx(0.25) and found["max_weighted_lag"] == 4
    assert found["trained_episode_s"] == pytest.approx(5.0) and found["dispatched_episode_s"] == pytest.approx(5.0)
    assert (found["max_staleness"], found["max_token_staleness"]) == (1, 2)
    assert client.get("/v1/runs/999999/staleness").status_code == 404
    page = client.get(f"/runs/{seeded.run_id}")  # the dashboard's run page: its Staleness section
    assert page.status_code == 200 and 'id="drop-reasons"' in page.text and "zero_variance <b>1</b>" in page.text
    assert 'id="masked-frac">25.00%' in page.text
    group_page = client.get(f"/groups/{complete}").text
    assert 'id="drop-reason">dropped: zero_variance' in group_page
