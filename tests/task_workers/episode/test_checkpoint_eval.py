"""A training run's checkpoint evaluated at a chosen step (`crucible eval launch --run R --step S`), against the
session's real vLLM: the checkpoint (written as the trainer writes one) is loaded into the server and probed
under a label of its own; the eval run's turns all carry that label; another checkpoint is not loaded while
it runs; once other weights serve (a trainer's push under the checkpoint's own version number), its next
episode stores no turn; and while a training run is active a checkpoint eval is refused, nothing
launched and nothing loaded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from cli.main import app
from controller.config import ControllerConfig
from controller.dispatcher import RecordingDispatcher
from controller.loop import Controller
from core.models import Episode, PolicyVersion, Run, Turn
from core.schemas.trainer import TrainerConfig
from core.settings import get_settings
from core.versions import CHECKPOINT_TAG_BASE, Label
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.episode.errors import PolicyFault
from task_workers.episode.runner import run_episode
from task_workers.policy.client import PolicyClient
from tests import factories
from trainer.checkpoint import CheckpointStore, TrainerState
from trainer.engine import make_engine
from trainer.loop import load_policy
from trainer.serving import VllmServer
from trainer.weight_sync import make_weight_syncer

pytestmark = [pytest.mark.docker, pytest.mark.vllm]

SPEC = {"name": "ckpt-read-number", "kind": "read_number", "image": "code-repo",
        "sandbox": {"memory": "256m", "pids": 64, "workspace_size": "16m", "tmp_size": "16m", "max_lifetime_s": 600},
        "limits": {"max_turns": 2, "episode_timeout_s": 60, "tool_timeout_s": 5, "max_tool_errors": 2,
                   "max_response_tokens": 16},
        "verifier": {"weights": {"answer": 1.0}}}
STEP, VERSION = 3, 3



def _served(server: VllmServer) -> Label | None:
    """The server's label, less its load's nonce."""
    label = Label.parse(httpx.get(f"{server.base_url}/weight_info").json()["weight_version"])
    return None if label is None else dataclasses.replace(label, load=None)

def _checkpoint(run_id: int, *, model_dir: Path, root: Path) -> Path:
    """Step STEP of `run_id` as the trainer leaves it: the engine's state (weights moved off the starting
    ones, so the probe can tell them apart) in a promoted `step-N/`."""
    config = TrainerConfig()
    engine = make_engine(model=load_policy(str(model_dir), config=config), config=config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in engine.module.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    store = CheckpointStore(root)
    store.write_pending(engine=engine, state=TrainerState(run_id=run_id, step=STEP, policy_version=VERSION,
                                                          consumed_groups=0))
    return store.promote(STEP)


def _launch(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["eval", "launch", *args])
    return result.exit_code, result.output


def test_a_checkpoint_is_loaded_verified_and_its_eval_keeps_only_its_turns(
    db_session: Session, served_original: VllmServer, tiny_model_dir: Path, sandboxes, code_repo_image,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine,
) -> None:
    monkeypatch.setenv("CRUCIBLE_POLICY_URL", served_original.api_url)
    monkeypatch.delenv("CRUCIBLE_POLICY_URLS", raising=False)
    monkeypatch.delenv("CRUCIBLE_POLICY_TOKENIZER", raising=False)
    get_settings.cache_clear()
    env, _ = register_environment(db_session, spec=parse_spec(SPEC))
    for number in ("4821", "1736"):
        factories.task(db_session, env, split="test", external_id=f"n-{number}", instruction="Read number.txt.",
                       payload={"path": "number.txt", "number": number})
    train = factories.run(db_session, name="ckpt-train", purpose="train", status="completed",
                          model=str(tiny_model_dir), config={})
    path = _checkpoint(train.id, model_dir=tiny_model_dir, root=tmp_path / "checkpoints")
    db_session.add(PolicyVersion(run_id=train.id, version=VERSION, training_step=STEP, checkpoint_path=str(path)))
    busy = factories.run(db_session, name="ckpt-busy", purpose="train", status="running", model=str(tiny_model_dir))
    db_session.commit()

    # An active training run would push its own weights over the checkpoint: refused before anything loads.
    code, out = _launch("--run", str(train.id), "--step", str(STEP), "-e", env.name)
    assert code == 2 and f"training runs {busy.id} (ckpt-busy, running)" in out, out
    assert _served(served_original) == Label(0)
    busy.status = "stopped"
    db_session.commit()
    code, out = _launch("--run", str(train.id), "--step", "7", "-e", env.name)
    assert code == 2 and f"run {train.id} recorded no training step 7 (its steps: 3 to 3" in out, out

    code, out = _launch("--run", str(train.id), "--step", str(STEP), "-e", env.name, "-k", "2", "-o", "json")
    assert code == 0, out
    launched = json.loads(out[out.index("{"):])
    tag = launched["checkpoint"]["tag"]
    assert launched["checkpoint"] == {"run_id": train.id, "step": STEP, "version": VERSION, "tag": tag}
    assert tag >= CHECKPOINT_TAG_BASE  # a label of its own: no training version, no other evaluation's
    assert _served(served_original) == Label(tag)  # committed, naming no run

    recorder = RecordingDispatcher()
    controller = Controller(engine=engine, dispatcher=recorder, settings=ControllerConfig(), name="ckpt-eval")
    client = PolicyClient(base_url=served_original.api_url)
    try:
        assert controller.step().dispatched == {launched["id"]: 2}
        first, *rest = recorder.episode_ids
        assert run_episode(first, policy=client, sandboxes=sandboxes, worker="ckpt").stored
        versions = db_session.execute(select(Turn.weight_version, Turn.weight_version_end)
                                      .where(Turn.episode_id == first)).all()
        assert versions and set(versions) == {(tag, tag)}

        # Another checkpoint is not loaded while this evaluation runs …
        code, out = _launch("--run", str(train.id), "--step", "0", "-e", env.name, "-k", "1")
        assert code == 2 and f"eval runs {launched['id']}" in out, out
        # … and if other weights replace it anyway (a trainer's push, under a training version), the eval's
        # next episode is refused turn by turn (an infrastructure fault, retried), never stored.
        syncer = make_weight_syncer("reload", base_url=served_original.base_url, model_dir=served_original.model_dir)
        syncer.push(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), label=Label.fresh(VERSION, run=None))
        syncer.close()
        with pytest.raises(PolicyFault, match=f"evaluates the checkpoint loaded under label {tag}"):
            run_episode(rest[0], policy=client, sandboxes=sandboxes, worker="ckpt")
        db_session.expire_all()
        assert db_session.execute(select(func.count()).select_from(Turn).where(Turn.episode_id == rest[0])).scalar() == 0
        assert db_session.get(Episode, rest[0]).status != "completed"
    finally:
        client.close()
        controller.close()

    assert CliRunner().invoke(app, ["run", "stop", str(launched["id"])]).exit_code == 0
    code, out = _launch("--run", str(train.id), "--step", "0", "-e", env.name, "-k", "1")  # the starting weights
    assert code == 0 and f"of run {train.id} step 0" in out, out
    result = CliRunner().invoke(app, ["eval", "checkpoints", str(train.id), "-o", "json"])
    assert result.exit_code == 0, result.output
    comparison = json.loads(result.output)
    assert [(point["step"], point["report"]["overall"]["episodes"]) for point in comparison["evals"]] == [(0, 0), (STEP, 1)]
    assert db_session.execute(select(func.count()).select_from(Run).where(Run.purpose == "eval")).scalar() == 2
