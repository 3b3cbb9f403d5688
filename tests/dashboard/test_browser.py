"""The dashboard in a real headless Chromium: log in, then click runs → run → group → episode → a token.

Screenshots of every step are kept under artifacts/screenshots/ (gitignored).
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from core.models import Run
from tests.api.trajectories import SeededRun
from tests.dashboard.conftest import screenshot, sign_in

expect = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)").expect


def test_drill_down_from_the_runs_list_to_a_token(page, token: str, seeded: SeededRun) -> None:  # type: ignore[no-untyped-def]
    sign_in(page, token, shot="01-login")
    screenshot(page, "02-runs")

    page.click(f"a.run-link[href='/runs/{seeded.run_id}']")
    page.wait_for_selector("#chart-reward-env svg")
    page.wait_for_selector("#chart-termination svg rect")
    page.wait_for_selector("#chart-staleness svg rect")
    assert page.locator("#live-note").is_visible()  # the run is running: the page polls
    assert "by training step" in page.locator(".axis-name").first.inner_text()
    screenshot(page, "03-run")

    trained, degenerate, _ = seeded.group_ids
    assert page.locator(f"a.group-link[href='/groups/{degenerate}']").locator("xpath=../..").inner_text().count("degenerate") == 1
    page.click(f"a.group-link[href='/groups/{trained}']")
    page.wait_for_selector(".rollouts")
    assert "diverge at turn 1" in page.locator("#divergence").inner_text()
    assert page.locator(".rollout").count() == 4
    # The seeded group was never trained on: no advantage exists yet (the page computes none itself).
    assert page.locator("#rollout-0 .advantage b").inner_text() == "not trained yet"
    screenshot(page, "04-group")

    page.click("#rollout-0 a.episode-link")
    page.wait_for_selector("#turn-0")
    assert page.locator("#verifier-layers tbody tr").count() >= 2
    assert "+return a + b" in page.locator("#final-diff").inner_text()
    assert "python -m pytest -q" in page.locator("#sandbox-events").inner_text()
    screenshot(page, "05-episode")

    page.click(".tokens-button[data-index='0']")
    page.wait_for_selector("#tokens-0 .tok")
    assert page.locator("#tokens-0 .tok.m0").count() == 3 and page.locator("#tokens-0 .tok.m1").count() == 2
    page.click("#tokens-0 .tok[data-j='3']")
    detail = page.locator("#token-detail")
    assert detail.is_visible()
    text = detail.inner_text()
    assert "id 5" in text and '"run"' in text and "mask 1" in text and "logprob -0.1000" in text
    assert page.url.endswith("#turn-0-token-3")
    screenshot(page, "06-token")

    assert page.foreign_requests == []
    assert page.console_errors == []


def test_a_running_runs_page_refreshes_itself(page, token: str, seeded: SeededRun, db_session: Session) -> None:  # type: ignore[no-untyped-def]
    sign_in(page, token)
    page.goto(f"/runs/{seeded.run_id}")
    page.wait_for_selector("#chart-reward-env svg")
    db_session.execute(update(Run).where(Run.id == seeded.run_id).values(policy_version=7, status="stopped"))
    db_session.commit()
    expect(page.locator("#run-version")).to_have_text("7")  # polled, not reloaded
    expect(page.locator("#run-status .badge")).to_have_text("stopped")
    page.wait_for_selector("#live-note", state="hidden")  # a stopped run is not polled any more


def test_a_token_deep_link_opens_the_token_view(page, token: str, seeded: SeededRun) -> None:  # type: ignore[no-untyped-def]
    episode = seeded.episode_ids[0][0]
    sign_in(page, token)  # a token never travels in a URL (access logs, login CSRF)
    page.goto(f"/episodes/{episode}#turn-1-token-1")
    page.wait_for_selector("#tokens-1 .tok.selected")
    assert "turn 1 · token 1" in page.locator("#token-detail").inner_text()
    screenshot(page, "07-deep-link")


def test_episode_search_filters_on_the_server(page, token: str, seeded: SeededRun) -> None:  # type: ignore[no-untyped-def]
    sign_in(page, token)
    page.goto("/episodes")
    page.fill("#q", "segfault")
    page.click("#episode-filters button[type=submit]")
    page.wait_for_url(re.compile(r"q=segfault"))
    assert "run_id=" not in page.url  # empty fields are not submitted
    rows = page.locator("table.episodes tbody tr")
    assert rows.count() == 1 and "format_error" in rows.first.inner_text()
    screenshot(page, "08-search")
