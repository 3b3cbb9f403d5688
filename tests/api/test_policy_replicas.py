"""GET /v1/policy/replicas: each replica of the policy pool asked now (in parallel) — serving, paused,
its weight version — with no credentials shown, behind the token like every route."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from fastapi.testclient import TestClient

from core.settings import get_settings
from tests.support.scripted_policy import ScriptedPolicy, _free_port, serve


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
    port = _free_port()
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
