"""`POST /v1/environments/{name}/tasks` for the chat and read_number kinds: Crucible JSONL
(`{"id", "instruction", "split"?, "payload"}`, the payload checked by the kind's own parser) imports;
each hostile line is a 422 naming the line and the field, and nothing of the upload is stored."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.environments.test_task_lines import CHAT, CHAT_LINES, HOSTILE, NUMBER, NUMBER_LINES


def _upload(client: TestClient, environment: str, body: str, **params: str):  # type: ignore[no-untyped-def]
    return client.post(f"/v1/environments/{environment}/tasks", content=body, params=params,
                       headers={"content-type": "application/x-ndjson"})


@pytest.fixture
def registered(client: TestClient) -> None:
    for spec in (CHAT, NUMBER):
        response = client.post("/v1/environments", json=spec)
        assert response.status_code == 201, response.text


def _tasks(client: TestClient, environment: str) -> dict[str, dict]:
    data = client.get("/v1/tasks", params={"environment": environment}).json()["data"]
    return {task["external_id"]: client.get(f"/v1/tasks/{task['id']}").json() for task in data}


def test_chat_and_read_number_jsonl_upload(client: TestClient, registered: None) -> None:
    for environment, lines in (("support", CHAT_LINES), ("numbers", NUMBER_LINES)):
        response = _upload(client, environment, "\n".join(json.dumps(line) for line in lines))
        assert response.status_code == 201 and response.json() == {"environment": environment, "imported": 2}
    chat = _tasks(client, "support")
    assert chat["refund-1"]["payload"] == {"follow_ups": ["It was a blue mug.", "Thanks!"]}
    assert chat["refund-1"]["instruction"] == "My order came broken."
    numbers = _tasks(client, "numbers")
    assert numbers["rn-42"]["instruction"] == "The file number.txt holds a number. Read it and submit it."
    assert numbers["rn-7"]["split"] == "test"


def test_each_hostile_line_is_a_422_and_stores_nothing(client: TestClient, registered: None) -> None:
    for environment, line, message in HOSTILE:
        good = CHAT_LINES[0] if environment == "support" else NUMBER_LINES[0]
        response = _upload(client, environment, json.dumps(good) + "\n" + json.dumps(line))
        assert response.status_code == 422, (line, response.text)
        said = response.json()["error"]["message"]
        assert message.replace(":1:", ":2:") in said and "\n" not in said, (line, said)
    for body, params, message in [
        (json.dumps(NUMBER_LINES[0]), {"format": "swebench", "repos_dir": "x"},
         "format: expected crucible for 'numbers' (a read_number environment), got 'swebench'"),
        (json.dumps(NUMBER_LINES[0]), {"repos_dir": "/etc"}, "repos_dir: expected none for a read_number environment"),
    ]:
        response = _upload(client, "numbers", body, **params)
        assert response.status_code == 422 and message in response.json()["error"]["message"], response.text
    assert _tasks(client, "support") == {} and _tasks(client, "numbers") == {}
