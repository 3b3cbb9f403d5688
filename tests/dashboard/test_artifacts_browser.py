"""A browser episode's page in a real headless Chromium: per turn the action, the accessibility tree and the
screenshot (which actually loads), the opening observation above the first turn, and a note where an
artifact was not stored. The page itself reads only the artifacts' metadata."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from task_workers.episode.trajectory import ArtifactRecord
from tests.api.trajectories import SeededRun
from tests.dashboard.conftest import screenshot, sign_in
from tests.support.browser_episode import browser_trajectory, stored_browser_episode

expect = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)").expect

BAD = ArtifactRecord(0, "page", "text/html", b"<script>alert(1)</script>")


@pytest.fixture
def episode_id(db_session: Session) -> int:
    return stored_browser_episode(db_session, run_name="browser-page", trajectory=browser_trajectory(extra=[BAD]))


def _loaded(page, selector: str) -> int:  # type: ignore[no-untyped-def]
    """Scroll a lazy <img> into view, wait until the browser is done with it, and give its natural width
    (0 for an image that failed to load). Waits go through locator assertions: the page's CSP forbids
    eval, which `page.wait_for_function` needs once it has to poll."""
    image = page.locator(selector)
    image.scroll_into_view_if_needed()
    expect(image).to_have_js_property("complete", True)
    return int(image.evaluate("el => el.naturalWidth"))


def test_a_browser_episode_shows_action_tree_and_screenshot_per_turn(page, token: str, episode_id: int) -> None:  # type: ignore[no-untyped-def]
    sign_in(page, token)
    page.goto(f"/episodes/{episode_id}")
    page.wait_for_selector("#turn-1")

    opening = page.locator("#opening")
    assert opening.locator("img").get_attribute("loading") == "lazy"
    expect(opening.locator("details.artifact-text pre")).to_contain_text("Goal:")
    assert "[8] button 'Submit'" in opening.locator("details.artifact-text pre").inner_text()
    assert _loaded(page, "#opening .shot img") == 160

    for index, (bid, tree) in enumerate([("7", "button 'Cancel' focused"), ("8", "StaticText 'Done: reward 1'")]):
        turn = page.locator(f"#turn-{index}")
        assert "click" in turn.locator(".bubble.tool .who").inner_text()
        assert f'"bid": "{bid}"' in turn.locator("pre.args").inner_text()
        assert not turn.locator(f"#tree-{index} pre").is_visible()  # collapsed until asked for
        turn.locator(f"#tree-{index} summary").click()
        assert tree in turn.locator(f"#tree-{index} pre").inner_text()  # the full tree, not the capped one
        assert _loaded(page, f"#turn-{index} .shot img") == 160

    note = page.locator("#turn-0 details.artifact-text.note")
    expect(note.locator("pre")).to_contain_text("not stored")
    assert "'text/html'" in note.inner_text() and "media type" in note.inner_text()
    screenshot(page, "09-browser-episode")

    assert page.foreign_requests == []
    assert page.console_errors == []


def test_the_page_reads_no_artifact_bytes(client: TestClient, episode_id: int, engine: Engine) -> None:
    """Only metadata is read to render the page: the bytes come through the artifact route, lazily."""
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        html = client.get(f"/episodes/{episode_id}").text
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    artifact_reads = [s for s in statements if "episode_artifacts" in s]
    assert artifact_reads and not any("episode_artifacts.data" in s for s in artifact_reads)
    assert html.count('loading="lazy"') == 3 and html.count(f'<img loading="lazy" decoding="async" src="/v1/episodes/{episode_id}/artifacts/') == 3
    assert "<script>alert(1)</script>" not in html


def test_a_turn_without_a_screenshot_still_shows_its_tree(client: TestClient, db_session: Session,
                                                          seeded: SeededRun) -> None:
    trajectory = browser_trajectory()
    trajectory.artifacts = [a for a in trajectory.artifacts if a.turn_index != 1]
    episode_id = stored_browser_episode(db_session, run_name="no-shot", trajectory=trajectory)
    html = client.get(f"/episodes/{episode_id}").text
    turn_1 = html[html.index('id="turn-1"'):]
    assert 'id="tree-1"' in turn_1 and "StaticText &#39;Done: reward 1&#39;" in turn_1 and "<img" not in turn_1
    code_page = client.get(f"/episodes/{seeded.episode_ids[0][1]}").text  # no artifacts: the code look, unchanged
    assert 'id="tree-' not in code_page and 'id="opening"' not in code_page and "<img" not in code_page
