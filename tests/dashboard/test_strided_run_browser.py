"""The run page of a long run in a real headless Chromium: the metrics come strided (`max_points`),
the charts draw them and the page says which steps they are."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from tests.api.test_run_points import long_run
from tests.dashboard.conftest import screenshot, sign_in

pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")


def test_a_long_runs_page_charts_strided_steps_and_says_so(  # type: ignore[no-untyped-def]
    page, token: str, db_session: Session
) -> None:
    run_id = long_run(db_session, first=1, count=2500)  # the page asks for 480 points: stride ceil(2499 / 479) = 6
    sign_in(page, token)
    page.goto(f"/runs/{run_id}")
    page.wait_for_selector("#chart-reward-env svg path")
    page.wait_for_selector("#chart-training svg path")
    note = "(1 step in 6 of 2500, and the latest)"
    assert page.locator(".axis-name").first.inner_text() == f"by training step {note}"
    assert page.locator("#training-stride").inner_text() == note
    assert page.locator("#cost-table tbody").inner_text().strip() == "No step has recorded its cost yet."
    screenshot(page, "run-strided")
    assert page.console_errors == []
