"""Which checkpoints the trainer keeps for evaluating later (`keep_every`), and how a checkpoint that is
gone, or not the one the database names, is refused before anything is loaded into a policy server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from core.errors import ConfigError, NotFound
from core.schemas.run import CheckpointRef, RecordedStep
from core.schemas.trainer import TrainerConfig
from trainer.checkpoint import STATE_FILE, CheckpointStore, TrainerState, complete_steps
from trainer.checkpoint_eval import checkpoint_engine
from trainer.engine import make_engine
from trainer.loop import load_policy


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    config = TrainerConfig()
    return make_engine(model=load_policy(str(tiny_model_dir), config=config), config=config)


def _write(store: CheckpointStore, engine, *, step: int, run_id: int = 1) -> Path:  # type: ignore[no-untyped-def]
    store.write_pending(engine=engine, state=TrainerState(run_id=run_id, step=step, policy_version=step,
                                                          consumed_groups=step))
    return store.promote(step)


def test_keep_every_keeps_each_nth_step_beside_the_newest(tmp_path: Path, tiny_engine) -> None:  # type: ignore[no-untyped-def]
    every = CheckpointStore(tmp_path / "every", keep=2, keep_every=3)
    newest = CheckpointStore(tmp_path / "newest", keep=2)
    for step in range(1, 8):
        _write(every, tiny_engine, step=step)
        _write(newest, tiny_engine, step=step)
    assert complete_steps(every.root) == [3, 6, 7]  # 6 and 7 the newest two; 3 and 6 every third
    assert complete_steps(newest.root) == [6, 7]
    assert every.latest() is not None and every.latest()[1].step == 7  # type: ignore[index]
    assert complete_steps(tmp_path / "missing") == []


def test_a_checkpoint_loads_the_weights_it_holds_and_a_gone_or_foreign_one_is_refused(
    tmp_path: Path, tiny_engine, tiny_model_dir: Path,  # type: ignore[no-untyped-def]
) -> None:
    store = CheckpointStore(tmp_path / "run-4", keep=1)
    with torch.no_grad():
        original = {name: tensor.clone() for name, tensor in tiny_engine.module.state_dict().items()}
        for parameter in tiny_engine.module.parameters():
            parameter.mul_(0.5)
    try:
        path = _write(store, tiny_engine, step=2, run_id=4)
        halved = {name: tensor.clone() for name, tensor in tiny_engine.module.state_dict().items()}
    finally:
        tiny_engine.module.load_state_dict(original)

    def step(at: Path | None, *, step: int = 2) -> RecordedStep:
        return RecordedStep(ref=CheckpointRef(run_id=4, step=step, version=step), model=str(tiny_model_dir),
                            checkpoint_path=None if at is None else str(at))

    loaded = checkpoint_engine(step(path), config=TrainerConfig()).module.state_dict()
    for name, tensor in halved.items():
        torch.testing.assert_close(loaded[name], tensor)
    starting = checkpoint_engine(step(None, step=0), config=TrainerConfig()).module.state_dict()
    for name, tensor in original.items():
        torch.testing.assert_close(starting[name], tensor)

    _write(store, tiny_engine, step=3, run_id=4)  # keep=1: step 2 is pruned
    with pytest.raises(NotFound, match=r"run 4 step 2 is not on disk at .*; kept there: 3$"):
        checkpoint_engine(step(path), config=TrainerConfig())
    foreign = tmp_path / "foreign"
    shutil.copytree(store.root / "step-000003", foreign)
    state = json.loads((foreign / STATE_FILE).read_text())
    (foreign / STATE_FILE).write_text(json.dumps({**state, "run_id": 9}))
    with pytest.raises(ConfigError, match=r"expected the checkpoint of run 4 step 3 .*, got run 9 step 3"):
        checkpoint_engine(step(foreign, step=3), config=TrainerConfig())
