"""Evaluating a training run's checkpoints, at the edges: a run config may not claim a checkpoint (only
`crucible eval launch --run R --step S` sets one, after loading it), the step must be one the trainer
recorded, and a training run's checkpoint evaluations come back by step with their intervals
(GET /v1/runs/{id}/checkpoint-evals). The load itself, against the real vLLM:
tests/task_workers/episode/test_checkpoint_eval.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from controller.errors import InvalidRunState
from controller.evaluation import check_servers_free, launch_eval, recorded_step
from core.errors import ConfigError, NotFound
from core.models import PolicyVersion, Run
from core.schemas.run import CheckpointRef
from core.versions import CHECKPOINT_TAG_BASE
from tests import factories
from tests.support.eval_runs import seed_eval_run
from trainer.store import hold_trainer_lock


def _train_run(session: Session, *, steps: tuple[int, ...] = (), status: str = "completed") -> Run:
    run = factories.run(session, purpose="train", status=status)
    for step in steps:
        session.add(PolicyVersion(run_id=run.id, version=10 * step, training_step=step,  # the version, not the step,
                                  checkpoint_path=f"/ckpt/step-{step}"))                 # is what it was served as
    session.flush()
    return run


def test_a_run_config_cannot_claim_a_checkpoint(client: TestClient, db_session: Session) -> None:
    env = factories.environment(db_session, name="ckpt-claim", kind="read_number")
    factories.task(db_session, env, split="test")
    db_session.commit()
    body = {"name": "forged", "model": "m", "purpose": "eval", "split": "test", "environments": [{"name": env.name}],
            "checkpoint": {"run_id": 1, "step": 5, "version": 5}}
    response = client.post("/v1/runs", json=body)
    assert response.status_code == 422, response.text
    assert "checkpoint: expected none in a run config (`crucible eval launch --run R --step S`" in \
        response.json()["error"]["message"]
    response = client.post("/v1/runs", json={**body, "purpose": "train", "split": "train"})
    assert response.status_code == 422 and "checkpoint: expected only on an eval run" in response.text
    for hostile in ({"run_id": 0, "step": 1, "version": 1}, {"run_id": 1, "step": -1, "version": 1},
                    {"run_id": 1, "step": 1, "version": 1, "path": "/etc"}, {"run_id": "1; drop", "step": 1, "version": 1}):
        response = client.post("/v1/runs", json={**body, "checkpoint": hostile})
        assert response.status_code == 422 and "checkpoint" in response.json()["error"]["message"], hostile
    assert db_session.execute(select(func.count()).select_from(Run).where(Run.name == "forged")).scalar() == 0


def test_the_step_must_be_one_the_trainer_recorded(db_session: Session) -> None:
    train = _train_run(db_session, steps=(2, 4, 6))
    found = recorded_step(db_session, run_id=train.id, step=4)
    assert (found.ref, found.checkpoint_path) == (CheckpointRef(run_id=train.id, step=4, version=40), "/ckpt/step-4")
    start = recorded_step(db_session, run_id=train.id, step=0)  # the starting weights: no checkpoint to load
    assert (start.ref.version, start.checkpoint_path, start.model) == (0, None, train.model)
    with pytest.raises(NotFound, match=rf"run {train.id} recorded no training step 5 \(its steps: 2 to 6;"):
        recorded_step(db_session, run_id=train.id, step=5)
    with pytest.raises(NotFound, match="its steps: none"):
        recorded_step(db_session, run_id=_train_run(db_session).id, step=1)
    with pytest.raises(NotFound):
        recorded_step(db_session, run_id=10**9, step=1)
    evaluation = seed_eval_run(db_session, name="ckpt-not-train", outcomes=[[1.0]])
    with pytest.raises(ConfigError, match=f"expected a training run, got run {evaluation.id} of purpose eval"):
        recorded_step(db_session, run_id=evaluation.id, step=0)


def test_whatever_may_load_other_weights_keeps_the_servers(db_session: Session, engine: Engine) -> None:
    check_servers_free(db_session)
    pending = _train_run(db_session, status="pending")
    with pytest.raises(InvalidRunState, match=rf"training runs {pending.id} \({pending.name}, pending\)"):
        check_servers_free(db_session)
    pending.status = "stopped"
    db_session.flush()
    check_servers_free(db_session)
    factories.run(db_session, purpose="eval", status="running")  # an eval of a model pushes no weights
    check_servers_free(db_session)
    stopped = _train_run(db_session, status="stopped")
    db_session.commit()
    lock = hold_trainer_lock(engine, run_id=stopped.id)  # its trainer is still alive: it would re-sync
    try:
        with pytest.raises(InvalidRunState, match=rf"trainer processes of runs {stopped.id} are alive"):
            check_servers_free(db_session)
    finally:
        lock.release()
    check_servers_free(db_session)
    evaluating = seed_eval_run(db_session, name="ckpt-active", outcomes=[[1.0, "running"]],
                               checkpoint=CheckpointRef(run_id=stopped.id, step=0, version=0, tag=CHECKPOINT_TAG_BASE))
    with pytest.raises(InvalidRunState, match=rf"eval runs {evaluating.id} \({evaluating.name}\) evaluate a checkpoint"):
        check_servers_free(db_session)
    with pytest.raises(ConfigError, match=r"checkpoint\.tag: expected the label its weights were loaded under"):
        launch_eval(db_session, model="m", environment="ckpt-active", samples_per_task=1,
                    checkpoint=CheckpointRef(run_id=stopped.id, step=0, version=0))


def test_checkpoint_evals_come_back_by_step(client: TestClient, db_session: Session) -> None:
    train = _train_run(db_session, steps=(10, 20))
    late = seed_eval_run(db_session, name="ckpt-20", outcomes=[[1.0, 1.0], [1.0, 0.0]],
                         checkpoint=CheckpointRef(run_id=train.id, step=20, version=20, tag=CHECKPOINT_TAG_BASE + 20))
    early = seed_eval_run(db_session, name="ckpt-10", outcomes=[[0.0, 0.0], [1.0, 0.0]],
                          checkpoint=CheckpointRef(run_id=train.id, step=10, version=10, tag=CHECKPOINT_TAG_BASE + 10))
    seed_eval_run(db_session, name="ckpt-plain", outcomes=[[1.0]])  # no checkpoint: not in the comparison
    other = _train_run(db_session)
    db_session.commit()
    body = client.get(f"/v1/runs/{train.id}/checkpoint-evals").json()
    assert [(point["step"], point["version"], point["report"]["run_id"]) for point in body["evals"]] == \
        [(10, 10, early.id), (20, 20, late.id)]
    assert [point["report"]["overall"]["pass_at_1"]["value"] for point in body["evals"]] == [0.25, 0.75]
    assert body["evals"][0]["report"]["checkpoint"] == {"run_id": train.id, "step": 10, "version": 10,
                                                        "tag": CHECKPOINT_TAG_BASE + 10}
    assert body["evals"][0]["report"]["environments"] == ["ckpt-10"]
    assert client.get(f"/v1/runs/{other.id}/checkpoint-evals").json() == {"run_id": other.id, "evals": []}
    assert client.get("/v1/runs/999999/checkpoint-evals").status_code == 404
    assert client.get("/v1/runs/-1/checkpoint-evals").status_code == 422


def test_the_cli_names_what_it_expected(db_session: Session) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    def launch(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["eval", "launch", "-e", "anything", *args])
        return result.exit_code, " ".join(result.output.split())

    assert launch() == (2, "error: expected MODEL, or --run and --step for a training run's checkpoint; got neither")
    assert launch("/models/x", "--run", "3") == (2, "error: expected MODEL alone, or --run and --step together; "
                                                    "got MODEL /models/x, --run 3")
    assert launch("--step", "0")[1].endswith("got --step 0")
    code, out = launch("--run", "999999", "--step", "1")
    assert code == 2 and "no run with id 999999" in out
    result = CliRunner().invoke(app, ["eval", "checkpoints", "999999"])
    assert result.exit_code == 2 and "no run with id 999999" in result.output
    train = _train_run(db_session)
    db_session.commit()
    result = CliRunner().invoke(app, ["eval", "checkpoints", str(train.id)])
    assert result.exit_code == 0 and f"no checkpoint of run {train.id} evaluated yet" in " ".join(result.output.split())
