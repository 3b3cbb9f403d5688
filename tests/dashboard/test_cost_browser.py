"""The run page in a real headless Chromium shows the cost breakdown every training step recorded:
seconds by stage (rollout, update, reference, reward) charted over steps, and the latest steps'
figures (tokens, step seconds, FLOP/s, MFU) in a table — the numbers the real trainer step stored
(tests/trainer/cost_steps.py), read back from the database by the test."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from tests.dashboard.conftest import screenshot, sign_in
from tests.factories import make_run
from tests.trainer.cost_steps import train_steps
from trainer import cost

pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")

COLUMNS = [cost.ROLLOUT_S, cost.UPDATE_S, cost.REFERENCE_S, cost.REWARD_S, cost.UPDATE_TOKENS, cost.STEP_S,
           cost.FLOPS_PER_S, cost.MFU]


def test_the_run_page_shows_each_steps_cost_breakdown(  # type: ignore[no-untyped-def]
    page, token: str, db_session: Session, tiny_model_dir: Path, tmp_path: Path,
) -> None:
    run_id, rows = train_steps(db_session, model_dir=tiny_model_dir, tmp_path=tmp_path, steps=2, kl_beta=0.1)
    sign_in(page, token)
    page.goto(f"/runs/{run_id}")
    page.wait_for_selector("#cost-table tbody tr[data-step]")

    shown = page.locator("#cost-table tbody tr")
    assert shown.count() == 2
    for index, row in enumerate(reversed(rows)):  # newest first
        line = shown.nth(index)
        cells = [line.locator("td").nth(i).inner_text() for i in range(9)]
        assert cells[0] == str(row.step)
        for text, key in zip(cells[1:], COLUMNS, strict=True):
            value = row.metrics[key]
            if value is None:
                assert text == "–", key  # MFU on CPU: no known peak
            else:
                assert float(text) == pytest.approx(value, rel=0.06, abs=0.006), key  # printed rounded
    # The chart: one bar segment per stage per step (every stage cost something here) and a legend.
    segments = page.locator("#chart-cost svg rect.point")
    assert segments.count() == sum(1 for row in rows for stage in cost.STAGES
                                   if row.metrics[f"cost/{stage}/seconds"])
    legend = page.locator("#chart-cost").inner_text()
    for stage in cost.STAGES:
        assert stage in legend
    assert f"crucible run cost {run_id}" in page.locator("#cost figcaption").inner_text()
    screenshot(page, "run-cost-breakdown")


def test_a_run_without_trained_steps_says_it_has_no_cost_yet(  # type: ignore[no-untyped-def]
    page, token: str, db_session: Session,
) -> None:
    run = make_run(db_session, model="/models/none")
    db_session.commit()
    sign_in(page, token)
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#cost-table tbody td.empty")
    assert page.locator("#cost-table tbody").inner_text().strip() == "No step has recorded its cost yet."
    assert "No step has recorded its cost yet." in page.locator("#chart-cost").inner_text()
