"""`POST /v1/environments/{name}/tasks` for a browser environment: browser JSONL (`{"id", "payload":
{BrowserTask}, ...}`) is imported and upserted; a code_repo line, a bad payload or a file format the kind
does not import is a 422 naming what was expected. (Generated formats — miniwob, shop — are CLI-only.)"""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from environments.browser.sandbox.sites import shop

BROWSER = {"name": "web", "kind": "browser", "image": "browser", "sandbox": {"memory": "2g", "pids": 1024}}


def _upload(client: TestClient, body: str, **params: str):  # type: ignore[no-untyped-def]
    return client.post("/v1/environments/web/tasks", content=body, params=params,
                       headers={"content-type": "application/x-ndjson"})


def test_browser_jsonl_uploads_and_updates(client: TestClient) -> None:
    assert client.post("/v1/environments", json=BROWSER).status_code == 201
    lines = [{"id": "mw", "payload": {"family": "miniwob", "name": "click-button", "seed": 2}},
             {"id": "shop-3", "payload": {"family": "site", "navigation": True, **shop.generate_task(3)}}]
    body = "\n".join(json.dumps(line) for line in lines)
    for _ in range(2):
        response = _upload(client, body)
        assert response.status_code == 201 and response.json() == {"environment": "web", "imported": 2}
    tasks = client.get("/v1/tasks", params={"environment": "web"}).json()["data"]
    assert sorted(task["external_id"] for task in tasks) == ["mw", "shop-3"]
    shown = client.get(f"/v1/tasks/{next(t['id'] for t in tasks if t['external_id'] == 'shop-3')}").json()
    assert shown["instruction"] == shop.generate_task(3)["goal"] and shown["payload"]["site_seed"] == 6


def test_bad_browser_uploads_are_422(client: TestClient) -> None:
    assert client.post("/v1/environments", json=BROWSER).status_code == 201
    code_line = json.dumps({"id": "t", "instruction": "fix", "repo": {"format": "tar", "data_b64": ""},
                            "hidden_tests": {"paths": ["t.py"]}})
    for body, params, message in [
        (code_line, {}, "line:1: expected only id, instruction, split and payload, got ['hidden_tests', 'repo']"),
        (json.dumps({"id": "t", "payload": {"family": "miniwob", "name": "../../etc/passwd"}}), {},
         "line:1: payload.name: String should match pattern"),
        (code_line, {"format": "swebench", "repos_dir": "x"}, "format: expected crucible, miniwob, shop for 'web'"),
        (json.dumps({"id": "t", "payload": {"family": "miniwob", "name": "click-button"}}), {"repos_dir": "/etc"},
         "repos_dir: expected none for a browser environment, got '/etc'"),
        ("\n\n", {}, "body: expected JSONL (one task object per line), got an empty upload"),
    ]:
        response = _upload(client, body, **params)
        assert response.status_code == 422, response.text
        assert message in response.json()["error"]["message"], response.json()
    assert client.get("/v1/tasks", params={"environment": "web"}).json()["data"] == []
