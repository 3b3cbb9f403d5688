"""`/v1/episodes/{id}/artifacts[/{artifact_id}]`: metadata without bytes, bytes only as an allow-listed type
that no browser will run, only for an artifact of that episode, only with a token."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from core.models import Episode, EpisodeArtifact
from task_workers.episode.trajectory import ArtifactRecord
from tests.api.trajectories import SeededRun
from tests.support.browser_episode import browser_trajectory, stored_browser_episode

SCRIPT = b"<html><body><script>fetch('/v1/runs',{method:'POST'})</script></body></html>"


@pytest.fixture
def episode_id(db_session: Session) -> int:
    extra = [ArtifactRecord(1, "page_text", "text/plain", SCRIPT)]
    return stored_browser_episode(db_session, run_name="browser", trajectory=browser_trajectory(extra=extra))


def _artifacts(client: TestClient, episode_id: int) -> list[dict]:
    response = client.get(f"/v1/episodes/{episode_id}/artifacts")
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_the_list_is_metadata_in_turn_order(client: TestClient, episode_id: int, db_session: Session) -> None:
    rows = _artifacts(client, episode_id)
    assert [(row["turn_index"], row["name"], row["media_type"]) for row in rows] == [
        (None, "observation", "text/plain"), (None, "screenshot", "image/png"), (0, "screenshot", "image/png"),
        (1, "screenshot", "image/png"), (1, "page_text", "text/plain")]
    assert all(set(row) == {"id", "turn_index", "name", "media_type", "size"} for row in rows)
    sizes = dict(db_session.execute(select(EpisodeArtifact.id, EpisodeArtifact.size)).all())
    assert {row["id"]: row["size"] for row in rows} == sizes


def test_an_episode_without_artifacts_lists_none(client: TestClient, seeded: SeededRun) -> None:
    assert _artifacts(client, seeded.episode_ids[0][0]) == []


def test_a_screenshot_comes_back_byte_for_byte_with_headers_that_forbid_running_it(
    client: TestClient, episode_id: int, db_session: Session,
) -> None:
    for row in _artifacts(client, episode_id):
        response = client.get(f"/v1/episodes/{episode_id}/artifacts/{row['id']}")
        assert response.status_code == 200
        stored = db_session.execute(select(EpisodeArtifact.data).where(EpisodeArtifact.id == row["id"])).scalar_one()
        assert response.content == stored and len(stored) == row["size"]
        expected = "text/plain; charset=utf-8" if row["media_type"] == "text/plain" else row["media_type"]
        assert response.headers["content-type"] == expected
        assert response.headers["x-content-type-options"] == "nosniff"
        csp = [part.strip() for part in response.headers["content-security-policy"].split(";")]
        assert "default-src 'none'" in csp and "sandbox" in csp
        assert response.headers["cross-origin-resource-policy"] == "same-origin"


def test_html_in_an_artifact_is_served_as_inert_text(client: TestClient, episode_id: int) -> None:
    row = next(row for row in _artifacts(client, episode_id) if row["name"] == "page_text")
    response = client.get(f"/v1/episodes/{episode_id}/artifacts/{row['id']}")
    assert response.content == SCRIPT and response.headers["content-type"] == "text/plain; charset=utf-8"


def test_a_type_off_the_allow_list_is_never_served_as_itself(
    client: TestClient, episode_id: int, db_session: Session,
) -> None:
    """The table refuses such a row; should one get in anyway (the check dropped by hand), the route
    still does not trust it: an attachment of opaque bytes, not a page."""
    artifact_id = _artifacts(client, episode_id)[0]["id"]
    db_session.execute(text("ALTER TABLE episode_artifacts DROP CONSTRAINT ck_episode_artifacts_media_type_allowed"))
    try:
        db_session.execute(text("UPDATE episode_artifacts SET media_type = 'text/html' WHERE id = :id"), {"id": artifact_id})
        db_session.commit()
        response = client.get(f"/v1/episodes/{episode_id}/artifacts/{artifact_id}")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        assert response.headers["content-disposition"] == "attachment"
        assert response.headers["x-content-type-options"] == "nosniff"
    finally:
        db_session.rollback()
        db_session.execute(text("DELETE FROM episode_artifacts"))
        db_session.execute(text("ALTER TABLE episode_artifacts ADD CONSTRAINT ck_episode_artifacts_media_type_allowed "
                                "CHECK (media_type IN ('image/png', 'image/jpeg', 'text/plain'))"))
        db_session.commit()


def test_an_artifact_id_of_another_episode_is_not_found(client: TestClient, episode_id: int, db_session: Session) -> None:
    other = stored_browser_episode(db_session, run_name="other")
    theirs = _artifacts(client, other)[1]["id"]
    response = client.get(f"/v1/episodes/{episode_id}/artifacts/{theirs}")
    assert response.status_code == 404
    assert response.json()["error"] == {
        "code": "not_found", "detail": None,
        "message": f"episode {episode_id} has no artifact {theirs}; GET /v1/episodes/{episode_id}/artifacts lists them"}
    assert client.get(f"/v1/episodes/{other}/artifacts/{theirs}").status_code == 200


@pytest.mark.parametrize(("path", "status"), [
    ("/v1/episodes/{e}/artifacts/9223372036854775807", 404),
    ("/v1/episodes/9223372036854775807/artifacts", 404),
    ("/v1/episodes/9223372036854775807/artifacts/{a}", 404),
    ("/v1/episodes/{e}/artifacts/9223372036854775808", 422),
    ("/v1/episodes/{e}/artifacts/99999999999999999999999999999999", 422),
    ("/v1/episodes/99999999999999999999999999999999/artifacts", 422),
    ("/v1/episodes/{e}/artifacts/0", 422),
    ("/v1/episodes/{e}/artifacts/-1", 422),
    ("/v1/episodes/0/artifacts", 422),
    ("/v1/episodes/{e}/artifacts/abc", 422),
    ("/v1/episodes/{e}/artifacts/1.5", 422),
    ("/v1/episodes/{e}/artifacts/1e3", 422),
    ("/v1/episodes/{e}/artifacts/%00", 422),
    ("/v1/episodes/{e}/artifacts/%20{a}", 200),  # pydantic strips the space: the same artifact, nothing more
    ("/v1/episodes/{e}/artifacts/..%2F..%2Fruns", 404),  # no such route: %2F is a slash to the router
    ("/v1/episodes/abc/artifacts", 422),
    ("/v1/episodes/abc/artifacts/{a}", 422),
    ("/v1/episodes/{e}/artifacts/{a}/x", 404),
])
def test_worst_ids(client: TestClient, episode_id: int, path: str, status: int) -> None:
    artifact_id = _artifacts(client, episode_id)[0]["id"]
    response = client.get(path.format(e=episode_id, a=artifact_id))
    assert response.status_code == status, response.text
    if status != 200:
        assert set(response.json()["error"]) == {"code", "message", "detail"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic dXNlcjpwYXNz"},
                                     {"Authorization": "Bearer "}])
def test_no_live_token_no_artifacts(anonymous: TestClient, client: TestClient, episode_id: int,
                                    headers: dict[str, str]) -> None:
    artifact_id = _artifacts(client, episode_id)[0]["id"]
    for path in (f"/v1/episodes/{episode_id}/artifacts", f"/v1/episodes/{episode_id}/artifacts/{artifact_id}"):
        response = anonymous.get(path, headers=headers)
        assert response.status_code == 401, path
        assert response.json()["error"]["code"] == "unauthorized" and b"PNG" not in response.content


def test_the_dashboard_cookie_reads_artifacts(app, token: str, client: TestClient, episode_id: int) -> None:  # type: ignore[no-untyped-def]
    """The episode page's <img> carries the login cookie, not a header: GET with it works."""
    artifact_id = _artifacts(client, episode_id)[1]["id"]
    from tests.api.test_auth import sign_in

    with TestClient(app) as browser:
        sign_in(browser, token)
        response = browser.get(f"/v1/episodes/{episode_id}/artifacts/{artifact_id}")
    assert response.status_code == 200 and response.content.startswith(b"\x89PNG")


def test_the_episode_and_its_artifacts_go_together(client: TestClient, episode_id: int, db_session: Session) -> None:
    db_session.execute(delete(Episode).where(Episode.id == episode_id))
    db_session.commit()
    assert client.get(f"/v1/episodes/{episode_id}/artifacts").status_code == 404
