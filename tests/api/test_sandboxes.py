"""Sandbox events by sandbox id and by episode; Prometheus /metrics."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.models import Episode, SandboxEvent
from tests.api.trajectories import T0, SeededRun


def test_events_of_a_sandbox_oldest_first_and_paged(client: TestClient, seeded: SeededRun) -> None:
    first = client.get("/v1/sandboxes/sb-00010/events?limit=3").json()
    assert [e["kind"] for e in first["data"]] == ["create", "acquire", "exec"]
    rest = client.get(f"/v1/sandboxes/sb-00010/events?limit=3&cursor={first['next_cursor']}").json()
    assert [e["kind"] for e in rest["data"]] == ["reset", "release"] and rest["next_cursor"] is None
    execs = client.get("/v1/sandboxes/sb-00010/events?kind=exec").json()["data"]
    assert execs[0]["detail"] == {"command": "python -m pytest -q", "exit_code": 1}
    assert client.get("/v1/sandboxes/sb-unknown/events").json() == {"data": [], "next_cursor": None}


def test_episode_events_include_its_sandboxs_untagged_events_while_it_ran(
    client: TestClient, db_session: Session, seeded: SeededRun
) -> None:
    episode = db_session.get(Episode, seeded.episode_ids[0][0])
    assert episode is not None and episode.finished_at is not None
    db_session.add_all([
        SandboxEvent(sandbox_id=episode.sandbox_id, kind="oom", detail={"command": "make"}, created_at=episode.finished_at),
        SandboxEvent(sandbox_id=episode.sandbox_id, kind="reap", detail={}, created_at=T0.replace(year=2030)),
    ])
    db_session.commit()
    kinds = [e["kind"] for e in client.get(f"/v1/episodes/{episode.id}/sandbox-events").json()["data"]]
    assert kinds == ["create", "acquire", "exec", "reset", "release", "oom"]  # not the later reap
    assert client.get("/v1/episodes/999/sandbox-events").status_code == 404


def test_prometheus_metrics_need_a_token_and_expose_requests_and_the_store(
    client: TestClient, anonymous: TestClient, seeded: SeededRun
) -> None:
    assert anonymous.get("/metrics").status_code == 401
    client.get(f"/v1/runs/{seeded.run_id}")
    text = client.get("/metrics").text
    assert 'crucible_api_requests_total{method="GET",route="/v1/runs/{run_id}",status="200"}' in text
    assert 'crucible_runs{status="running"} 1.0' in text
    assert f'crucible_run_episodes{{run="{seeded.run_id}",status="completed"}} 10.0' in text
    assert f'crucible_run_training_step{{run="{seeded.run_id}"}} 2.0' in text
