"""A training run's checkpoint served for evaluation (`crucible eval launch --run R --step S`).

    step = recorded_step(session, run_id=3, step=40)     # controller.evaluation: the step, its version
    engine = checkpoint_engine(step, config=config)      # the run's starting model + the checkpoint's state
    serve_checkpoint(engine, step=with_tag, publisher=publisher)    # with_tag.ref.tag: checkpoint_tag()

The weights are what the trainer itself would push at that step: the run's model and trainer config
(LoRA merged on export, ZeRO gathered) with the checkpoint's engine state loaded (`step-N/`, as
trainer.checkpoint writes it); step 0 is the starting weights alone. The push is the trainer's own
(trainer.sync.Publisher: load → probe → label), under a label of its own (core.versions.checkpoint_tag: no
training version, no other evaluation's), so the servers are proven to score like the checkpoint before
any turn of the eval is sampled, and a turn sampled by any other weights can be told apart.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from core.errors import ConfigError, NotFound
from core.schemas.run import RecordedStep
from core.schemas.trainer import TrainerConfig
from trainer.checkpoint import STATE_FILE, complete_steps
from trainer.engine import PolicyEngine, make_engine
from trainer.loop import load_policy
from trainer.sync import Publisher, SyncReport

log = logging.getLogger(__name__)


def checkpoint_engine(step: RecordedStep, *, config: TrainerConfig) -> PolicyEngine:
    """An engine holding the weights of `step` (NotFound when its checkpoint is no longer on disk)."""
    engine = make_engine(model=load_policy(step.model, config=config), config=config)
    if step.checkpoint_path is None:
        return engine
    ref, path = step.ref, Path(step.checkpoint_path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise NotFound(f"--step: the checkpoint of run {ref.run_id} step {ref.step} is not on disk at {path} (the "
                       "trainer keeps the newest `keep_checkpoints` and every `keep_every`-th step); kept there: "
                       f"{', '.join(map(str, complete_steps(path.parent))) or 'none'}")
    state = json.loads(state_file.read_text())
    if state.get("run_id") != ref.run_id or state.get("step") != ref.step:
        raise ConfigError(f"--step: expected the checkpoint of run {ref.run_id} step {ref.step} at {path}, got "
                          f"run {state.get('run_id')!r} step {state.get('step')!r}")
    engine.load(path)
    return engine


def serve_checkpoint(engine: PolicyEngine, *, step: RecordedStep, publisher: Publisher) -> SyncReport:
    """Every policy replica serves `engine`'s weights, probed, labelled the step's `tag` (WeightSyncError
    when none passed: each is rolled back to what it served)."""
    if step.ref.tag is None:
        raise ConfigError("expected a checkpoint label (core.versions.checkpoint_tag), got none")
    report = publisher.push(engine=engine, version=step.ref.tag)
    log.info("run %d step %d (version %d) loaded under label %d in %.1f s", step.ref.run_id, step.ref.step,
             step.ref.version, step.ref.tag, report.seconds)
    return report
