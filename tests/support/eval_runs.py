"""An eval run with chosen outcomes, written as the controller and the workers would leave it: what the
API and dashboard tests of `crucible eval`'s report read (tests/task_workers/episode/test_eval_known_skill.py
plays one for real)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from controller.evaluation import launch_eval
from core.models import Run
from core.schemas.run import CheckpointRef
from tests import factories

Outcome = float | str
"""A counted episode's reward, or `failed` (an infrastructure fault) / `running` (not ended)."""


def seed_eval_run(session: Session, *, name: str, outcomes: list[list[Outcome]],
                  difficulty: list[str | None] | None = None, checkpoint: CheckpointRef | None = None) -> Run:
    """One held-out task per entry of `outcomes` (its k episodes' outcomes), an eval run over them with one
    group per task (of `checkpoint`, as `crucible eval launch --run R --step S` records one once loaded);
    committed."""
    env = factories.queued_environment(session, name=name, kind="read_number")
    tasks = [factories.task(session, env, split="test", difficulty=(difficulty or [None] * len(outcomes))[i])
             for i in range(len(outcomes))]
    run = launch_eval(session, model="scripted", environment=name, samples_per_task=len(outcomes[0]),
                      checkpoint=checkpoint)
    for index, (task, episodes) in enumerate(zip(tasks, outcomes, strict=True)):
        group = factories.group(session, env=env, task=task, run=run, group_index=index, size=len(episodes))
        for sample, outcome in enumerate(episodes):
            if outcome == "failed":
                fields = {"status": "failed", "termination_reason": "sandbox_error"}
            elif outcome == "running":
                fields = {"status": "running"}
            else:
                fields = {"status": "completed", "termination_reason": "submitted", "reward": outcome}
            factories.episode(session, group, sample_index=sample, **fields)
    if checkpoint is not None and not any(outcome == "running" for episodes in outcomes for outcome in episodes):
        run.status = "completed"  # ended, as a checkpoint's evaluation must before another is loaded
    session.commit()
    return run
