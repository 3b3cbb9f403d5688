"""`/v1/environments/{name}/tasks` (JSONL upload, raw or multipart) and `/v1/tasks`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    directory = tmp_path / "calc"
    directory.mkdir()
    (directory / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return directory


def _line(repo: Path, task_id: str, split: str = "train") -> str:
    return json.dumps({"id": task_id, "instruction": f"fix {task_id}", "split": split, "repo": str(repo),
                       "hidden_tests": {"command": "python -m pytest -q"}})


@pytest.fixture
def calc(client: TestClient) -> str:
    assert client.post("/v1/environments", json={"name": "calc", "kind": "code_repo"}).status_code == 201
    return "calc"


def test_upload_a_raw_jsonl_body_then_update_by_multipart(client: TestClient, calc: str, repo: Path) -> None:
    body = "\n".join([_line(repo, "t1"), _line(repo, "t2", "test")]) + "\n"
    response = client.post(f"/v1/environments/{calc}/tasks", content=body, headers={"content-type": "application/x-ndjson"})
    assert response.status_code == 201 and response.json() == {"environment": "calc", "imported": 2}
    files = {"file": ("tasks.jsonl", _line(repo, "t1", "test").encode(), "application/x-ndjson")}
    assert client.post(f"/v1/environments/{calc}/tasks", files=files).json()["imported"] == 1

    tasks = client.get("/v1/tasks?environment=calc&split=test").json()["data"]
    assert sorted(task["external_id"] for task in tasks) == ["t1", "t2"]
    assert "payload" not in tasks[0]  # summaries in lists


def test_show_elides_the_repo_tarball_unless_asked(client: TestClient, calc: str, repo: Path) -> None:
    body = "\n".join(_line(repo, f"t{i}") for i in range(3))
    client.post(f"/v1/environments/{calc}/tasks", content=body, headers={"content-type": "text/plain"})
    task_id = client.get("/v1/tasks?environment=calc&limit=1").json()["data"][0]["id"]
    shown = client.get(f"/v1/tasks/{task_id}").json()
    assert shown["instruction"] == "fix t0" and shown["payload"]["hidden_tests"]["command"] == "python -m pytest -q"
    assert shown["payload"]["repo"]["data_b64"].startswith("<") or len(shown["payload"]["repo"]["data_b64"]) <= 2000
    full = client.get(f"/v1/tasks/{task_id}?elide_over=0").json()
    assert not full["payload"]["repo"]["data_b64"].startswith("<")


def test_tasks_are_paged_by_id(client: TestClient, calc: str, repo: Path) -> None:
    client.post(f"/v1/environments/{calc}/tasks", content="\n".join(_line(repo, f"t{i}") for i in range(5)))
    seen, cursor = [], None
    while True:
        page = client.get("/v1/tasks", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [task["external_id"] for task in page["data"]]
        if not (cursor := page["next_cursor"]):
            break
    assert seen == [f"t{i}" for i in range(5)]


@pytest.mark.parametrize(("body", "message"), [
    ("", "body: expected JSONL (one task object per line), got an empty upload"),
    ('{"id": "x", "repo": "relative/dir", "instruction": "i", "hidden_tests": {"command": "c"}}',
     "line 1: repo: expected an absolute path on the API server, got 'relative/dir'"),
    ("not json", "expected one JSON object per line"),
    ('{"id": "x", "instruction": "i", "repo": "/nonexistent/dir", "hidden_tests": {"command": "c"}}',
     "repo: expected a directory, a .tar.gz or a git repo with 'commit'"),
])
def test_bad_uploads_are_422_with_the_line_and_the_problem(client: TestClient, calc: str, body: str, message: str) -> None:
    response = client.post(f"/v1/environments/{calc}/tasks", content=body)
    assert response.status_code == 422
    assert message in response.json()["error"]["message"]


def test_an_upload_to_an_unknown_environment_is_404(client: TestClient) -> None:
    response = client.post("/v1/environments/ghost/tasks", content="{}")
    assert response.status_code == 404 and "no environment named 'ghost'" in response.json()["error"]["message"]


def test_a_multipart_upload_without_a_file_field(client: TestClient, calc: str) -> None:
    response = client.post(f"/v1/environments/{calc}/tasks", files={"other": ("x", b"{}")})
    assert response.status_code == 422 and "multipart field 'file'" in response.json()["error"]["message"]
