"""Without a live token nothing but /healthz answers: every route in app.routes is walked."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.dashboard.login import NONCE_COOKIE
from api.deps import COOKIE_NAME
from api.services.tokens import create_token, revoke_token
from core.models import ApiToken
from tests.api.trajectories import SeededRun

PUBLIC = {("GET", "/healthz")}
SAMPLE_PARAMS = {"name": "code-fix", "sandbox_id": "sb-00010"}


def _requests(app: FastAPI) -> list[tuple[str, str]]:
    """(method, concrete path) for every route and method the app serves."""
    found = []
    for route in app.routes:
        assert isinstance(route, APIRoute), f"unexpected route type {type(route).__name__} at {route.path}"
        path = re.sub(r"\{(\w+)\}", lambda m: SAMPLE_PARAMS.get(m.group(1), "1"), route.path)
        found.extend((method, path) for method in sorted(route.methods) if method != "HEAD")
    return found


def _assert_all_refused(client: TestClient, app: FastAPI) -> int:
    refused = 0
    for method, path in _requests(app):
        response = client.request(method, path)
        if (method, path) in PUBLIC:
            assert response.status_code == 200, path
            continue
        assert response.status_code == 401, f"{method} {path} answered {response.status_code}"
        if response.headers["content-type"].startswith("application/json"):
            assert response.json()["error"]["code"] == "unauthorized"
        else:
            assert 'name="token"' in response.text  # a page: the login form, with its 401
        refused += 1
    return refused


def test_every_route_but_healthz_refuses_a_request_without_a_token(
    anonymous: TestClient, app: FastAPI, seeded: SeededRun
) -> None:
    assert _assert_all_refused(anonymous, app) >= 30


def test_every_route_refuses_a_revoked_token_by_header_and_by_cookie(
    app: FastAPI, db_session: Session, seeded: SeededRun
) -> None:
    row, token = create_token(db_session, name="soon revoked")
    db_session.commit()
    with TestClient(app) as by_cookie:
        assert sign_in(by_cookie, token).status_code == 303  # type: ignore[attr-defined]
        revoke_token(db_session, ref=str(row.id))  # the token revoked: its dashboard sessions end with it
        db_session.commit()
        _assert_all_refused(by_cookie, app)
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as by_header:
        _assert_all_refused(by_header, app)
    with TestClient(app, cookies={COOKIE_NAME: token}) as raw_token_cookie:  # the token itself is no session
        _assert_all_refused(raw_token_cookie, app)
    with TestClient(app) as with_query:
        response = with_query.get(f"/runs/{seeded.run_id}?token={token}", follow_redirects=False)
        assert response.status_code == 401


def test_revocation_takes_effect_on_the_next_request(client: TestClient, db_session: Session, token: str) -> None:
    assert client.get("/v1/runs").status_code == 200
    revoke_token(db_session, ref="tests")
    db_session.commit()
    response = client.get("/v1/runs")
    assert response.status_code == 401
    assert "was revoked" in response.json()["error"]["message"]


def test_healthz_needs_no_token(anonymous: TestClient) -> None:
    response = anonymous.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_only_a_sha256_hash_is_stored(db_session: Session, token: str) -> None:
    stored = db_session.execute(select(ApiToken.token_hash, ApiToken.prefix)).one()
    assert token not in stored.token_hash and len(stored.token_hash) == 64
    assert token.startswith(stored.prefix) and len(stored.prefix) < len(token)


def test_a_malformed_authorization_header_says_what_was_expected(anonymous: TestClient) -> None:
    response = anonymous.get("/v1/runs", headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "expected `Authorization: Bearer <token>`, got a 'Basic' header"
    assert response.headers["www-authenticate"] == "Bearer"


def test_the_cookie_authorizes_reads_but_not_writes(app: FastAPI, token: str, seeded: SeededRun) -> None:
    with TestClient(app) as browser:
        sign_in(browser, token)
        assert browser.get(f"/v1/runs/{seeded.run_id}").status_code == 200
        assert browser.post(f"/v1/runs/{seeded.run_id}/stop").status_code == 401  # no cross-site writes


def _nonce(form_page: str) -> str:
    match = re.search(r'name="nonce" value="([^"]+)"', form_page)
    assert match, "the login form carries a nonce"
    return match.group(1)


def sign_in(client: TestClient, token: str, *, next_url: str = "/") -> object:
    """What a browser does: load the form (nonce cookie + field), then POST it."""
    form = client.get(f"/login?next={next_url}")
    return client.post("/login", data={"token": token, "next": next_url, "nonce": _nonce(form.text)},
                       follow_redirects=False)


def test_login_sets_an_http_only_strict_cookie_and_redirects_to_next(anonymous: TestClient, token: str) -> None:
    form = anonymous.get("/login?next=/episodes")
    assert form.status_code == 401 and 'value="/episodes"' in form.text
    response = anonymous.post("/login", data={"token": token, "next": "/episodes", "nonce": _nonce(form.text)},
                              follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/episodes"
    cookie = response.headers["set-cookie"]
    assert f"{COOKIE_NAME}=ses_" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert token not in cookie and token[4:] not in cookie  # a session's own secret, never the token
    assert anonymous.get("/episodes").status_code == 200  # the client kept the cookie


@pytest.mark.parametrize("next_url", ["//evil.example/x", "https://evil.example/", "\\\\evil", "runs"])
def test_login_never_redirects_off_the_server(anonymous: TestClient, token: str, next_url: str) -> None:
    response = sign_in(anonymous, token, next_url=next_url)
    assert response.headers["location"] == "/"  # type: ignore[attr-defined]


def test_a_wrong_token_in_the_login_form_is_a_401_with_the_reason(anonymous: TestClient, db_session: Session) -> None:
    response = sign_in(anonymous, "cru_nope")
    assert response.status_code == 401  # type: ignore[attr-defined]
    assert "expected a valid API token, got an unknown one" in response.text  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["/", "/episodes", "/login"])
def test_a_token_in_the_url_signs_nobody_in(anonymous: TestClient, token: str, seeded: SeededRun, path: str) -> None:
    """Login CSRF: a link to `/?token=ATTACKER` used to put the attacker's token in the victim's cookie."""
    response = anonymous.get(f"{path}?token={token}", follow_redirects=False)
    assert response.status_code == 401 and 'name="token"' in response.text
    assert f"{COOKIE_NAME}=" not in response.headers.get("set-cookie", "")
    assert anonymous.get("/episodes").status_code == 401


def test_a_cross_site_login_post_without_the_forms_nonce_is_refused(app: FastAPI, token: str) -> None:
    """The other half of login CSRF: another site auto-submitting its token to /login."""
    with TestClient(app) as victim:
        response = victim.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
        assert response.status_code == 401 and "without its nonce" in response.text
        assert f"{COOKIE_NAME}=" not in response.headers.get("set-cookie", "")
        victim.cookies.set(NONCE_COOKIE, "other", path="/login")
        forged = victim.post("/login", data={"token": token, "next": "/", "nonce": "guessed"}, follow_redirects=False)
        assert forged.status_code == 401
        assert victim.get("/episodes").status_code == 401


def test_logout_clears_the_cookie_and_revokes_its_session(app: FastAPI, token: str) -> None:
    """(issue 24) The cookie used to be the raw API token, and /logout only asked the browser to forget it:
    a copy kept working for 30 days. Now it is a session's secret, revoked server-side at /logout."""
    with TestClient(app) as browser:
        sign_in(browser, token)
        copied = browser.cookies.get(COOKIE_NAME)
        assert copied and copied.startswith("ses_") and browser.get("/episodes").status_code == 200
        response = browser.get("/logout", follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/login"
        assert f'{COOKIE_NAME}=""' in response.headers["set-cookie"]
    with TestClient(app, cookies={COOKIE_NAME: copied}) as replay:  # the copy, after the sign-out
        page = replay.get("/episodes")
        assert page.status_code == 401 and "signed out" in page.text
        assert replay.get("/v1/runs").json()["error"]["message"] == "this dashboard session was signed out: sign in again"
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as by_header:
        assert by_header.get("/v1/runs").status_code == 200  # the token itself lives on


@pytest.mark.parametrize("forged", ["ses_made_up", "", "ses_" + "x" * 4000, "cru_a_token_lookalike"])
def test_a_forged_session_cookie_signs_nobody_in(app: FastAPI, db_session: Session, forged: str) -> None:
    with TestClient(app, cookies={COOKIE_NAME: forged} if forged else {}) as browser:
        response = browser.get("/v1/runs")
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
