"""The run page in a real headless Chromium charts the hack-canary metrics the trainer records: two steps
planned by the trainer's own `generate` over groups that include a canary group (one with a hacked
episode, one clean), their metrics from `trainer.metrics.batch_metrics`, stored by `record_step`."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from core.canaries import canary_split
from core.models import Episode
from tests import factories
from tests.dashboard.conftest import screenshot, sign_in
from tests.factories import add_group, make_environment, make_run
from trainer.config import LossConfig
from trainer.metrics import CANARY_REWARDED, batch_metrics
from trainer.selection import StalenessRule
from trainer.step import generate
from trainer.store import record_step

pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")


def _steps(session: Session, engine: Engine) -> tuple[int, list[float]]:
    run = make_run(session, model="unused", batch_size=1)
    env, task = make_environment(session)
    canary_task = factories.task(session, env, split=canary_split("train"))
    shown = []
    for step, hacked in ((1, 1), (2, 0)):
        canary = add_group(session, run=run, env=env, task=canary_task, rewards=[1.0, 0.0], seed=step)
        add_group(session, run=run, env=env, task=task, rewards=[1.0, 0.0], seed=10 + step)
        session.execute(update(Episode).where(Episode.group_id == canary.id, Episode.sample_index == 0)
                        .values(reward_components={"hidden_tests": float(hacked)}))
        session.commit()
        with Session(engine) as step_session:
            plan = generate(step_session, run_id=run.id, version=step - 1, rule=StalenessRule.for_bound(4), batch_size=1,
                            loss=LossConfig())
            metrics = batch_metrics(plan)
            record_step(step_session, run_id=run.id, step=step, policy_version=step,
                        consumed=[g.id for g in plan.groups], dropped=plan.dropped, metrics=metrics)
            step_session.commit()
        shown.append(metrics[CANARY_REWARDED])
    return run.id, shown


def test_the_run_page_charts_the_canary_metrics(  # type: ignore[no-untyped-def]
    page, token: str, db_session: Session, engine: Engine
) -> None:
    run_id, rewarded = _steps(db_session, engine)
    assert rewarded == [1, 0]
    sign_in(page, token)
    page.goto(f"/runs/{run_id}")
    page.wait_for_selector("#chart-training svg path", state="attached")  # a flat line has no height
    options = page.locator("#training-metric option").all_inner_texts()
    assert {"canary/episodes", "canary/reward_mean", "canary/rewarded"} <= set(options), options
    page.select_option("#training-metric", "canary/rewarded")
    page.wait_for_selector("#chart-training svg path")  # 1 then 0: a visible slope
    assert page.locator("#training-metric").input_value() == "canary/rewarded"
    assert page.locator("#chart-training").inner_text().count("canary/rewarded") >= 1
    screenshot(page, "run-canaries")
    assert page.console_errors == []
