"""`GET /v1/metric-names` serves the trainer's metric and stage names from their one definition
(trainer.metrics, trainer.cost); the run page reads its cost stages there (tests/test_names.py holds that
run.js keeps no copy, tests/dashboard/test_cost_browser.py that the page draws every stage)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from trainer import cost, metrics


def test_the_names_are_the_trainers(client: TestClient) -> None:
    response = client.get("/v1/metric-names")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cost_stages"] == list(cost.STAGES)
    assert body["timing_stages"] == list(metrics.STAGES)
    assert body["families"] == list(metrics.FAMILIES)
    assert body["names"] == sorted(metrics.fixed_names())
    assert {metrics.REWARD_MEAN, cost.STEP_S} <= set(body["names"])
    assert all(metrics.is_metric_name(name) for name in body["names"])


def test_the_names_need_a_token(anonymous: TestClient) -> None:
    response = anonymous.get("/v1/metric-names")
    assert response.status_code == 401, response.text
    assert "names" not in response.text


def test_the_run_page_embeds_them(client: TestClient, seeded) -> None:
    """What run.js reads as NAMES: the names /v1/metric-names serves, in the page's data island."""
    import json
    import re

    page = client.get(f"/runs/{seeded.run_id}")
    assert page.status_code == 200, page.text
    island = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page.text, re.DOTALL)
    assert island is not None
    assert json.loads(island.group(1))["names"] == client.get("/v1/metric-names").json()
    header = re.search(r'<table class="list" id="cost-table"><thead>(.*?)</thead>', page.text, re.DOTALL)
    assert header is not None
    assert re.findall(r"<th class=\"num\">(\w+) s</th>", header.group(1)) == [*cost.STAGES, "step"]
