"""GET /v1/policy/replicas: each replica of the policy pool asked now (in parallel) — serving, paused,
its weight version — with no credentials shown, behind the token like every route."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from fastapi.testclient import TestClient

from core.net import free_port
from core.schemas.worker import ReplicaOut
from core.settings import get_settings
from task_workers.policy.scripted import ScriptedPolicy, serve


@pytest.fixture
def replicas() -> Iterator[list[tuple[ScriptedPolicy, str]]]:
    with ExitStack() as stack:
        servers = [ScriptedPolicy(), ScriptedPolicy()]
        yield [(server, stack.enter_context(serve(server))) for server in servers]


def _with_pool(monkeypatch: pytest.MonkeyPatch, urls: str) -> None:
    monkeypatch.setenv("CRUCIBLE_POLICY_URLS", urls)
    get_settings.cache_clear()


def test_each_replica_is_asked_now(client: TestClient, anonymous: TestClient, replicas, monkeypatch) -> None:
    (_, live), (paused_server, paused) = replicas
    paused_server.paused = True  # as the trainer leaves a replica whose weights failed their probe
    port = free_port()
    _with_pool(monkeypatch, f"{live},{paused},http://user:secret@127.0.0.1:{port}/v1")
    try:
        response = client.get("/v1/policy/replicas")
        assert anonymous.get("/v1/policy/replicas").status_code == 401
    finally:
        monkeypatch.delenv("CRUCIBLE_POLICY_URLS")
        get_settings.cache_clear()
    assert response.status_code == 200, response.text
    rows = response.json()["data"]
    assert [(r["name"], r["serving"], r["paused"], r["weight_version"], r["models"]) for r in rows] == [
        (live, True, False, "0", ["scripted"]), (paused, False, True, "0", ["scripted"]),
        (f"http://127.0.0.1:{port}/v1", False, None, None, [])]
    assert rows[2]["error"].startswith("ConnectError") and "secret" not in response.text


def test_one_server_is_a_pool_of_one(client: TestClient, replicas, monkeypatch) -> None:
    (_, live), _ = replicas
    monkeypatch.delenv("CRUCIBLE_POLICY_URLS", raising=False)
    monkeypatch.setenv("CRUCIBLE_POLICY_URL", live)
    get_settings.cache_clear()
    try:
        rows = client.get("/v1/policy/replicas").json()["data"]
    finally:
        monkeypatch.delenv("CRUCIBLE_POLICY_URL")
        get_settings.cache_clear()
    assert [(r["name"], r["serving"]) for r in rows] == [(live, True)]


def test_a_replica_a_worker_holds_out_is_shown_as_that_worker_sees_it(
    client: TestClient, replicas, monkeypatch, db_session
) -> None:
    """(issue 24) A replica that came back answers the API and doctor ("serving") while a worker keeps it
    out of rotation for its cool-down: both now say so, from the worker's heartbeat, until when and why."""
    import time

    from core.health import check_policy_pool, held_out
    from task_workers import heartbeat
    from task_workers.policy.pool import PolicyPool

    (_, live), (_, other) = replicas
    refused = f"http://127.0.0.1:{free_port()}/v1"
    pool = PolicyPool([other, refused], cooldown_s=60.0)
    pool.health(probe=True)  # the refused one goes out of rotation for 60 s
    out = pool.out_of_rotation()
    assert list(out) == [refused] and abs(out[refused].until - time.time() - 60) < 10
    assert "ConnectError" in str(out[refused].error)
    pool.close()
    # What a worker's beat publishes, for a replica that answers again now:
    until = time.time() + 42
    heartbeat.take_over(name="w-rotation", queues=["code_repo"])
    assert heartbeat.beat(name="w-rotation", queues=["code_repo"],
                          replicas_out={live: ReplicaOut(until=until, error="ConnectError: refused")})
    _with_pool(monkeypatch, f"{live},{other}")
    try:
        rows = client.get("/v1/policy/replicas").json()["data"]
        checks = check_policy_pool(get_settings(), held_out())
    finally:
        monkeypatch.delenv("CRUCIBLE_POLICY_URLS")
        get_settings.cache_clear()
    assert rows[0]["serving"] is True and [(h["worker"], h["error"]) for h in rows[0]["out_of_rotation"]] == [
        ("w-rotation", "ConnectError: refused")]
    from datetime import datetime

    assert abs(datetime.fromisoformat(rows[0]["out_of_rotation"][0]["until"]).timestamp() - until) < 0.01
    assert rows[1]["out_of_rotation"] == []
    assert not checks[0].ok and checks[0].detail.startswith(f"{live}: out of rotation on w-rotation until ")
    assert checks[1].ok
    heartbeat.mark_stopped(name="w-rotation")  # a stopped worker's view is no one's
    assert held_out() == {}


@pytest.mark.parametrize("published", [
    {"http://h:8000/v1": {"until": "soon"}},  # a wrong type
    {"http://h:8000/v1": {"until": 1e300, "error": None}},  # past any date
    {"http://h:8000/v1": {"until": 1.8e9, "eror": "typo"}},  # a field no heartbeat writes
    ["http://h:8000/v1"],
    "out",
])
def test_a_heartbeat_row_of_another_shape_is_not_news(db_session, published: object) -> None:
    """`workers.replicas_out` is written by the heartbeat only (core.schemas.worker); a row of another shape
    (a hand edit, an older worker) is left out of doctor and the API, never a crash."""
    from sqlalchemy import update

    from core.health import held_out
    from core.models import Worker
    from task_workers import heartbeat

    heartbeat.take_over(name="w-odd", queues=["code_repo"])
    heartbeat.beat(name="w-odd", queues=["code_repo"], replicas_out={"http://ok:8000/v1": ReplicaOut(until=1.8e9)})
    assert list(held_out()) == ["http://ok:8000/v1"]
    db_session.execute(update(Worker).where(Worker.name == "w-odd").values(replicas_out=published))
    db_session.commit()
    try:
        assert held_out() == {}
    finally:
        heartbeat.mark_stopped(name="w-odd")
