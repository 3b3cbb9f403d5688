"""The group page in a real headless Chromium shows the advantages the trainer used for a group it
trained on (stored by its step), the same the step's metrics summarise; never a formula of its own.

The trainer step here is the real one (claim → score → advantages → update → record) on the real
tiny model; it stops before publishing to vLLM, which tests/trainer/test_training.py covers.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import EpisodeGroup, TrainingStep
from tests.dashboard.conftest import screenshot, sign_in
from tests.factories import add_group, make_environment, make_run
from trainer import metrics
from trainer.loop import Trainer
from trainer.selection import StalenessRule
from trainer.step import generate

pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")


def test_the_group_page_shows_the_advantages_the_trainer_used(  # type: ignore[no-untyped-def]
    page, token: str, db_session: Session, tiny_model_dir: Path, tmp_path: Path,
) -> None:
    # GRPO std scaling and DAPO overlong shaping on: no reward-only formula gives these advantages.
    run = make_run(db_session, model=str(tiny_model_dir), group_size=4, batch_size=1,
                   trainer={"loss": {"scale_advantages_by_std": True, "overlong_max_tokens": 14,
                                     "overlong_buffer_tokens": 4}})
    env, task = make_environment(db_session)
    trained = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0, 0.5, 1.0], seed=1)
    waiting = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0, 0.0, 0.0], seed=2)
    db_session.commit()
    trainer = Trainer(run_id=run.id, publisher=None, checkpoint_root=tmp_path / "ck")  # type: ignore[arg-type]
    try:
        plan = generate(db_session, run_id=run.id, version=0, rule=StalenessRule.for_bound(1), batch_size=1,
                        loss=trainer.config.loss)
        assert [group.id for group in plan.groups] == [trained.id]
        trainer._commit(db_session, plan, trainer._learn(plan, {}), {})
    finally:
        trainer._lock.release()
    used = [sample.advantage for sample in sorted(plan.samples, key=lambda s: s.episode_id)]
    step = db_session.execute(select(TrainingStep).where(TrainingStep.run_id == run.id)).scalar_one()
    assert step.metrics[metrics.ADV_MEAN] == pytest.approx(statistics.fmean(used), abs=1e-6)
    assert step.metrics[metrics.ADV_STD] == pytest.approx(statistics.pstdev(used), abs=1e-6)
    assert db_session.get(EpisodeGroup, trained.id).status == "consumed"  # type: ignore[union-attr]

    sign_in(page, token)
    page.goto(f"/groups/{trained.id}")
    page.wait_for_selector(".rollouts")
    shown = [float(page.locator(f"#rollout-{index} .advantage b").inner_text()) for index in range(4)]
    assert shown == pytest.approx(used, abs=5e-5)  # printed with 4 decimals
    shown_mean, shown_std = statistics.fmean(shown), statistics.pstdev(shown)
    assert shown_mean == pytest.approx(step.metrics[metrics.ADV_MEAN], abs=1e-4)
    assert shown_std == pytest.approx(step.metrics[metrics.ADV_STD], abs=1e-4)
    screenshot(page, "group-trained-advantages")

    page.goto(f"/groups/{waiting.id}")  # complete, not trained on yet: no advantage to show
    page.wait_for_selector(".rollouts")
    assert [page.locator(f"#rollout-{index} .advantage b").inner_text() for index in range(4)] == \
        ["not trained yet"] * 4
