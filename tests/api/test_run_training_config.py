"""`POST /v1/runs` refuses trainer and sampling settings the trainer could not honour, naming the field,
what was expected and what was given; what it accepts is stored resolved (normalisation per run)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from tests import factories

CONFIG = {"name": "r1", "model": "tiny", "environments": [{"name": "calc"}]}


@pytest.mark.parametrize(("extra", "expected"), [
    ({"sampling": {"temperature": 0}}, "sampling.temperature: expected > 0 for a training run"),
    ({"sampling": {"top_k": 20}}, "sampling.top_k: expected -1 for a training run"),
    ({"sampling": {"repetition_penalty": 1.05}}, "sampling.repetition_penalty: expected 1.0 for a training run"),
    ({"trainer": {"loss": {"clip_low": 3}}}, "trainer.loss.clip_low: Input should be less than 1, got 3"),
    ({"trainer": {"lora": {"dropout": 1.5}}}, "trainer.lora.dropout: Input should be less than 1, got 1.5"),
    ({"trainer": {"optimizer": {"learning_rate": 1}}}, "trainer.optimizer.learning_rate: Extra inputs"),
])
def test_bad_training_settings_are_refused_at_launch(client: TestClient, extra: dict, expected: str) -> None:
    response = client.post("/v1/runs", json={**CONFIG, **extra})
    assert response.status_code == 422, response.text
    assert expected in response.json()["error"]["message"]


def test_normalisation_is_resolved_for_the_run_at_launch(client: TestClient, db_session: Session) -> None:
    for name in ("calc", "web"):
        factories.task(db_session, factories.environment(db_session, name=name))
    db_session.commit()
    one = client.post("/v1/runs", json=CONFIG).json()
    two = client.post("/v1/runs", json={**CONFIG, "name": "r2", "environments": [{"name": "calc"}, {"name": "web"}]})
    assert two.status_code == 201, two.text
    modes = [client.get(f"/v1/runs/{run['id']}").json()["config"]["trainer"]["loss"]["normalize_rewards_per_environment"]
             for run in (one, two.json())]
    assert modes == ["off", "on"]
