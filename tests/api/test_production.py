"""`CRUCIBLE_ENVIRONMENT=production` as the README says, and no token in any URL or log line.

Real processes: `crucible api` refusing to start, and a served dashboard login whose access log is read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.main import create_app
from api.services.tokens import create_token, revoke_token
from core.errors import ConfigError
from core.settings import get_settings, load_settings
from tests.api.live_server import ROOT, crucible_command, crucible_env, live_api


def _api(**settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(crucible_command("api", "--port", "1"), cwd=ROOT, env=crucible_env(**settings),
                          capture_output=True, text=True, timeout=120)


def test_production_refuses_to_start_without_a_token(db_session: Session) -> None:
    result = _api(environment="production")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("error: CRUCIBLE_API_TOKEN: expected a live API token in production (create one "
                                     "with `crucible token create NAME`), got none")


def test_production_refuses_an_unknown_or_revoked_token(db_session: Session) -> None:
    row, token = create_token(db_session, name="soon revoked")
    revoke_token(db_session, ref=str(row.id))
    db_session.commit()
    for candidate, reason in (("cru_made_up", "got an unknown one"), (token, "was revoked")):
        result = _api(environment="production", api_token=candidate)
        assert result.returncode == 2 and reason in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_production_app_refuses_to_start_however_it_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """`uvicorn api.main:app` directly runs the same check, in the app's lifespan."""
    monkeypatch.setenv("CRUCIBLE_ENVIRONMENT", "production")
    monkeypatch.delenv("CRUCIBLE_API_TOKEN", raising=False)
    get_settings.cache_clear()
    try:
        with pytest.raises(ConfigError, match="CRUCIBLE_API_TOKEN: expected a live API token in production"), \
                TestClient(create_app()):
            pass
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def test_production_refuses_debug_output() -> None:
    with pytest.raises(ConfigError, match=r"CRUCIBLE_LOG_LEVEL: expected INFO or higher in production"):
        load_settings(environment="production", log_level="DEBUG")


def _sign_in(client: httpx.Client, token: str) -> httpx.Response:
    form = client.get("/login?next=/episodes")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce
    return client.post("/login", data={"token": token, "next": "/episodes", "nonce": nonce.group(1)})


def test_production_serves_with_secure_cookies_and_no_internals(db_session: Session, tmp_path: Path) -> None:
    _, token = create_token(db_session, name="prod")
    db_session.commit()
    with live_api(tmp_path, environment="production", api_token=token) as api, \
            httpx.Client(base_url=api.url) as client:
        form = client.get("/login")
        assert "Secure" in form.headers["set-cookie"]  # the nonce cookie, even over plain http behind a proxy
        # httpx (like a browser) keeps Secure cookies for https: send it as the TLS proxy would pass it on
        cookie = form.headers["set-cookie"].split(";", 1)[0]
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
        assert nonce and cookie.endswith(nonce.group(1))
        signed_in = client.post("/login", data={"token": token, "next": "/", "nonce": nonce.group(1)},
                                headers={"Cookie": cookie})
        assert signed_in.status_code == 303
        assert "Secure" in signed_in.headers["set-cookie"] and "HttpOnly" in signed_in.headers["set-cookie"]


def test_no_token_in_the_access_log_after_a_dashboard_login(db_session: Session, tmp_path: Path) -> None:
    _, token = create_token(db_session, name="browser")
    db_session.commit()
    with live_api(tmp_path) as api:
        with httpx.Client(base_url=api.url) as browser:
            assert _sign_in(browser, token).status_code == 303
            assert browser.get("/episodes").status_code == 200  # signed in by the cookie
            assert browser.get("/v1/runs").status_code == 200
        # an old `?token=` link, or a stranger pasting one, neither signs in nor lands in the log
        stale = httpx.get(f"{api.url}/episodes?token={token}&page=2", follow_redirects=False)
        assert stale.status_code == 401 and "crucible_token=" not in stale.headers.get("set-cookie", "")
        httpx.get(f"{api.url}/v1/runs", headers={"Authorization": f"Bearer {token}"})
        log = api.log_text()
    assert '"POST /login HTTP/1.1" 303' in log and '"GET /episodes HTTP/1.1" 200' in log  # the log was written
    assert "GET /episodes?token=***&page=2" in log
    assert token not in log and token[4:] not in log


def test_a_port_in_use_is_one_line_naming_it(db_session: Session) -> None:
    """(issue 24) uvicorn printed six lines, "Application startup complete" among them, and exited 3."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = subprocess.run(crucible_command("api", "--port", str(port)), cwd=ROOT, env=crucible_env(),
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.strip().splitlines() == [
        f"error: --host/--port: expected an address this process can listen on, got 127.0.0.1:{port} "
        "(Address already in use)"], result.stderr
