"""Real trainer steps that record their cost, for the cost tests (trainer, CLI, browser).

The steps are the trainer's own (claim → score → advantages → update → record) on the real tiny
model over synthetic episodes (tests.factories) whose `timings` are set as a task worker would
write them; publishing to vLLM is left out (tests/trainer/test_training.py covers it).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode, TrainingStep
from tests.factories import add_group, make_environment, make_run
from trainer.loop import Trainer
from trainer.selection import StalenessRule
from trainer.step import generate


def episode_timings(index: int) -> dict[str, float]:
    """What a worker records (task_workers/episode/runner.py), different for every episode."""
    generation = 1.0 + 0.25 * index
    return {"generation": generation, "sandbox": 0.5, "lease": 0.1, "setup": 0.2, "verify": 0.3 + 0.05 * index,
            "total": generation + 0.5 + 0.1 + 0.2 + 0.3 + 0.05 * index}


def train_steps(session: Session, *, model_dir: Path, tmp_path: Path, steps: int, kl_beta: float = 0.1,
                vocab: int = 2000) -> tuple[int, list[TrainingStep]]:
    """A run trained `steps` real steps of one 2-episode group each; (run id, its training_steps rows)."""
    run = make_run(session, model=str(model_dir), group_size=2, batch_size=1,
                   trainer={"loss": {"kl_beta": kl_beta}})
    env, task = make_environment(session)
    for index in range(steps):
        group = add_group(session, run=run, env=env, task=task, rewards=[1.0, 0.0], seed=index, vocab=vocab)
        for episode in session.execute(select(Episode).where(Episode.group_id == group.id)).scalars():
            episode.timings = episode_timings(2 * index + episode.sample_index)
    session.commit()
    trainer = Trainer(run_id=run.id, publisher=None, checkpoint_root=tmp_path / "ck")  # type: ignore[arg-type]
    try:
        for step in range(steps):
            plan = generate(session, run_id=run.id, version=step, rule=StalenessRule.for_bound(steps), batch_size=1,
                            loss=trainer.config.loss)
            timings = {"generate": 0.0}  # one dict through the step, as train_one_step passes it
            trainer._commit(session, plan, trainer._learn(plan, timings), timings)
    finally:
        trainer._lock.release()
    rows = list(session.execute(select(TrainingStep).where(TrainingStep.run_id == run.id)
                                .order_by(TrainingStep.step)).scalars())
    return run.id, rows
