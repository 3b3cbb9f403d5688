"""One error format for every 4xx/5xx: {"error": {"code", "message", "detail"}}."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.trajectories import SeededRun


def _error(response, status: int) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}
    return body["error"]


def test_validation_errors_name_the_field_the_expectation_and_the_value(client: TestClient) -> None:
    error = _error(client.get("/v1/episodes?limit=0&status=lost"), 422)
    assert error["code"] == "validation_error"
    assert "query.limit: Input should be greater than or equal to 1, got '0'" in error["message"]
    assert "query.status: Input should be 'pending', 'running', 'scoring', 'completed', 'failed' or 'cancelled', got 'lost'" in error["message"]
    assert {tuple(item["loc"]) for item in error["detail"]} == {("query", "limit"), ("query", "status")}


def test_an_invalid_body_is_a_validation_error(client: TestClient) -> None:
    error = _error(client.post("/v1/runs", json={"name": "bad name!", "model": "m", "environments": []}), 422)
    assert "name: String should match pattern" in error["message"]
    assert "environments: List should have at least 1 item" in error["message"]
    error = _error(client.post("/v1/runs", content=b"{not json", headers={"content-type": "application/json"}), 422)
    assert error["code"] == "validation_error" and "JSON decode error" in error["message"]


def test_unknown_ids_are_404_with_a_hint(client: TestClient, seeded: SeededRun) -> None:
    error = _error(client.get("/v1/runs/999"), 404)
    assert error == {"code": "not_found", "message": "no run with id 999; `crucible run ls` lists the runs", "detail": None}
    assert _error(client.get("/v1/groups/999"), 404)["code"] == "not_found"
    assert "episode 1 has no turn 99" in _error(client.get("/v1/episodes/1/turns/99/tokens"), 404)["message"]


def test_unknown_routes_and_methods(client: TestClient) -> None:
    assert "no route GET /v1/nothing" in _error(client.get("/v1/nothing"), 404)["message"]
    assert _error(client.delete("/v1/runs"), 405)["message"] == "method DELETE is not allowed on /v1/runs"


def test_out_of_range_values_are_422_not_500(client: TestClient) -> None:
    assert _error(client.get(f"/v1/runs/{2**63}"), 422)["code"] == "validation_error"
    assert _error(client.get("/v1/episodes?environment=%00"), 422)["code"] == "validation_error"
    assert _error(client.get("/v1/episodes?min_reward=nan"), 422)["code"] == "validation_error"


def test_a_value_postgres_refuses_is_422(client: TestClient) -> None:
    error = _error(client.post("/v1/environments", json={"name": "nul", "kind": "code_repo", "description": "a\u0000b"}), 422)
    assert error["code"] == "invalid_value" and "the database refused a value" in error["message"]


def test_a_forged_cursor_is_rejected(client: TestClient) -> None:
    for cursor in ("garbage", "WyJ4Il0", "W10"):  # not base64 JSON; ["x"] for an int key; []
        error = _error(client.get(f"/v1/episodes?cursor={cursor}"), 422)
        assert error["code"] == "invalid_cursor"
        assert "expected the next_cursor of a previous page of this list" in error["message"]
