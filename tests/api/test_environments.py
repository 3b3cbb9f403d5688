"""`/v1/environments`: register specs (versioned by content), list the latest, show, versions."""

from __future__ import annotations

from fastapi.testclient import TestClient

SPEC = {"name": "calc", "kind": "code_repo", "description": "fix calc.py", "limits": {"max_turns": 8}}


def test_register_is_idempotent_and_a_change_is_a_new_version(client: TestClient) -> None:
    first = client.post("/v1/environments", json=SPEC)
    assert first.status_code == 201 and first.json()["created"] is True and first.json()["version"] == 1
    again = client.post("/v1/environments", json=SPEC)
    assert again.status_code == 200 and again.json()["created"] is False and again.json()["version"] == 1
    changed = client.post("/v1/environments", json={**SPEC, "limits": {"max_turns": 9}})
    assert changed.status_code == 201 and changed.json()["version"] == 2
    assert changed.json()["spec"]["limits"]["max_turns"] == 9

    assert client.get("/v1/environments/calc").json()["version"] == 2
    assert client.get("/v1/environments/calc?version=1").json()["spec"]["limits"]["max_turns"] == 8
    versions = client.get("/v1/environments/calc/versions").json()
    assert [row["version"] for row in versions["data"]] == [2, 1] and versions["next_cursor"] is None


def test_an_invalid_spec_says_which_field(client: TestClient) -> None:
    response = client.post("/v1/environments", json={"name": "calc", "kind": "nope"})
    assert response.status_code == 422
    assert "kind: expected one of agent_program, browser, chat, code_repo, openenv, read_number, got 'nope'" in response.json()["error"]["message"]
    response = client.post("/v1/environments", json={"name": "calc", "kind": "code_repo", "limits": {"max_turns": 0}})
    assert "limits.max_turns: Input should be greater than or equal to 1, got 0" in response.json()["error"]["message"]


def test_list_shows_the_latest_of_each_name_paged_by_name(client: TestClient) -> None:
    for name in ("alpha", "beta", "gamma"):
        client.post("/v1/environments", json={**SPEC, "name": name})
    client.post("/v1/environments", json={**SPEC, "name": "beta", "description": "v2"})
    first = client.get("/v1/environments?limit=2").json()
    assert [(row["name"], row["version"]) for row in first["data"]] == [("alpha", 1), ("beta", 2)]
    second = client.get(f"/v1/environments?limit=2&cursor={first['next_cursor']}").json()
    assert [row["name"] for row in second["data"]] == ["gamma"] and second["next_cursor"] is None
    assert "spec" not in first["data"][0]  # summaries in lists


def test_unknown_names_and_versions_are_404(client: TestClient) -> None:
    assert client.get("/v1/environments/ghost").status_code == 404
    client.post("/v1/environments", json=SPEC)
    response = client.get("/v1/environments/calc?version=7")
    assert response.status_code == 404 and "no version 7 of environment named 'calc'" in response.json()["error"]["message"]
    assert client.get("/v1/environments/ghost/versions").status_code == 404


def test_the_sandbox_section_is_validated_at_registration(client: TestClient) -> None:
    """`memory: lots` used to register fine, then fail every episode at the worker as an infrastructure fault."""
    for sandbox, message in (
        ({"memory": "lots"}, 'sandbox: memory: expected a size like "512m" or "2g", got "lots"'),
        ({"cpus": 0}, "sandbox: cpus: expected a number of cores between 0.01 and 256, got 0"),
        ({"user": "0:0"}, 'sandbox: user: expected a non-root numeric "uid:gid"'),
        ({"image": "other"}, "sandbox: expected no image here (the spec's `image` field names it), got 'other'"),
        ({"bogus": 1}, "sandbox: bogus: expected one of the known fields"),
    ):
        response = client.post("/v1/environments", json={**SPEC, "sandbox": sandbox})
        assert response.status_code == 422, sandbox
        assert message in response.json()["error"]["message"]
    assert client.get("/v1/environments").json()["data"] == []
    ok = client.post("/v1/environments", json={**SPEC, "sandbox": {"memory": "1g", "pids": 128}})
    assert ok.status_code == 201 and ok.json()["spec"]["sandbox"] == {"memory": "1g", "pids": 128}


def test_a_named_network_needs_the_operators_consent(client: TestClient, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from core.settings import get_settings

    networked = {**SPEC, "sandbox": {"network": "lab", "allow_network": True}}
    response = client.post("/v1/environments", json=networked)
    assert response.status_code == 422
    assert response.json()["error"]["message"] == ("sandbox.network: expected a network the operator allows (none: "
                                                   "CRUCIBLE_SANDBOX_NETWORKS is unset), got 'lab' with allow_network")
    host = client.post("/v1/environments", json={**SPEC, "sandbox": {"network": "host", "allow_network": True}})
    assert host.status_code == 422 and "are never allowed" in host.json()["error"]["message"]
    monkeypatch.setenv("CRUCIBLE_SANDBOX_NETWORKS", "lab,eval")
    get_settings.cache_clear()
    try:
        assert client.post("/v1/environments", json=networked).status_code == 201
        other = client.post("/v1/environments", json={**SPEC, "sandbox": {"network": "prod", "allow_network": True}})
        assert other.status_code == 422 and "(lab, eval), got 'prod'" in other.json()["error"]["message"]
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def test_a_judge_or_reward_model_must_be_a_server_the_operator_allows(client: TestClient, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Workers post every episode to a spec's judge and store its answer: a spec cannot aim them at an
    internal address. Allowed: the policy servers (any spelling of them) and CRUCIBLE_REWARD_SERVERS."""
    from core.settings import get_settings

    def judged(url: str, section: str = "judge") -> dict:
        config = {"url": url, "model": "m", "rubric": "r"} if section == "judge" else {"url": url}
        return {**SPEC, "name": f"judged-{section}", "verifier": {section: config}}

    monkeypatch.setenv("CRUCIBLE_POLICY_URL", "http://127.0.0.1:8000/v1")
    get_settings.cache_clear()
    try:
        for url, section in (("http://169.254.169.254/latest/v1", "judge"), ("http://127.0.0.1:8080/v1", "judge"),
                             ("http://user:secret@10.0.0.9:8001/v1", "reward_model")):
            response = client.post("/v1/environments", json=judged(url, section))
            assert response.status_code == 422, url
            message = response.json()["error"]["message"]
            assert message.startswith(f"verifier.{section}.url: expected a policy server or one listed in "
                                      "CRUCIBLE_REWARD_SERVERS, got") and "secret" not in message
        assert client.post("/v1/environments", json=judged("http://127.0.0.1:8000")).status_code == 201  # the policy's
        monkeypatch.setenv("CRUCIBLE_REWARD_SERVERS", "http://10.0.0.9:8001/v1")
        get_settings.cache_clear()
        assert client.post("/v1/environments", json=judged("http://10.0.0.9:8001/v1", "reward_model")).status_code == 201
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
