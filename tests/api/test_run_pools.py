"""(Issue 47, item 2) One live trainer per policy server: a second training run on servers another run's
live trainer holds is refused at launch — through the API (409) and the CLI (one line) — and its
trainer refuses to start; a run that names servers of its own (`policy_urls`, among those the operator
lists) is not. Two trainers on one pool would push over each other, and each run would sample with the
other's weights. (The real processes: tests/trainer/test_pool_sync.py::test_two_training_runs_on_one_pool.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.main import app
from core.pools import PoolHeld
from core.settings import get_settings
from tests import factories
from trainer.loop import Trainer
from trainer.store import hold_trainer_lock
from trainer.sync import PolicyServer, Publisher, Replica

OWN = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]  # nothing answers there: nothing is reached


@pytest.fixture(autouse=True)
def _own_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The operator lists OWN as servers runs may name (CRUCIBLE_POLICY_SERVERS)."""
    monkeypatch.setenv("CRUCIBLE_POLICY_SERVERS", ",".join(OWN))
    get_settings.cache_clear()
    yield
    monkeypatch.undo()
    get_settings.cache_clear()


def _publisher(url: str, tmp_path: Path) -> Publisher:
    """A publisher for one server; the test never pushes (the trainer refuses before any weight moves)."""
    server = PolicyServer(api_url=url, base_url=url.removesuffix("/v1"), model_name="m", model_dir=tmp_path)
    return Publisher(replicas=[Replica(server=server, syncer=SimpleNamespace(close=lambda: None))],  # type: ignore[arg-type]
                     probe_ids=[1, 2])


def _config(name: str, **extra: object) -> dict[str, object]:
    return {"name": name, "model": "tiny", "environments": [{"name": "pools"}], "group_size": 2, **extra}


def test_a_second_training_run_on_a_held_pool_is_refused_with_the_holder(
    client: TestClient, db_session: Session, engine: Engine, tmp_path: Path,
) -> None:
    env = factories.environment(db_session, name="pools")
    factories.task(db_session, env)
    holder = factories.run(db_session, purpose="train", status="running")  # on the platform's pool
    db_session.commit()
    before = client.post("/v1/runs", json=_config("before"))  # no trainer alive yet
    assert before.status_code == 201
    lock = hold_trainer_lock(engine, run_id=holder.id)  # what a live `crucible trainer --run` holds
    try:
        refused = client.post("/v1/runs", json=_config("second"))
        assert refused.status_code == 409, refused.text
        message = refused.json()["error"]["message"]
        assert f"held by the live trainer of run {holder.id}" in message and "policy_urls" in message
        assert get_settings().policy_pool[0] in message
        # The same servers spelt another way are the same servers.
        spelt = get_settings().policy_pool[0].removesuffix("/v1").upper().replace("HTTP", "http") + "/"
        assert client.post("/v1/runs", json=_config("spelt", policy_urls=[spelt])).status_code == 409

        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(_config("cli")))
        result = CliRunner().invoke(app, ["run", "launch", str(path)])
        assert result.exit_code != 0 and f"held by the live trainer of run {holder.id}" in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output  # one line, no traceback

        own = client.post("/v1/runs", json=_config("own", policy_urls=OWN))  # servers of its own
        assert own.status_code == 201 and client.get(f"/v1/runs/{own.json()['id']}").json()["config"]["policy_urls"] == OWN
        evaluation = client.post("/v1/runs", json=_config("eval", purpose="eval", split="train"))
        assert evaluation.status_code == 201  # an eval run pushes no weights

        # The run launched before the trainer started: its own trainer refuses to start there.
        with pytest.raises(PoolHeld, match=f"held by the live trainer of run {holder.id}"):
            Trainer(run_id=before.json()["id"], publisher=_publisher(get_settings().policy_pool[0], tmp_path),
                    checkpoint_root=tmp_path)
    finally:
        lock.release()
    assert client.post("/v1/runs", json=_config("after")).status_code == 201  # the trainer ended


@pytest.mark.parametrize("urls", [
    [], ["ftp://a/v1"], ["not a url"], ["http://a:8000/v1", "http://A:8000/"],  # one server spelt twice
    ["http://a/v1"] * 300, ["http://" + "a" * 5000], [None], "http://a/v1",
    ["http://169.254.169.254/v1"], [OWN[0], "http://10.0.0.1:8000/v1"],  # servers the operator does not list
])
def test_policy_urls_that_are_no_pool_are_refused_at_the_edge(
    client: TestClient, db_session: Session, urls: object,
) -> None:
    env = factories.environment(db_session, name="pools")
    factories.task(db_session, env)
    db_session.commit()
    response = client.post("/v1/runs", json=_config("bad", policy_urls=urls))
    assert response.status_code == 422, response.text
    assert "policy_urls" in response.text and len(response.text) < 4000
