"""A write is committed before its response leaves the server, so the client's next request sees it.

FastAPI (since 0.118) runs a `yield` dependency's exit code after the response is sent unless the
dependency says `scope="function"`. With the session's commit there, a browser that follows the 303
of POST /login at once could ask for `/` before the new dashboard session row was committed, and be
shown the sign-in form again (it failed a CI run: `#runs` never appeared). Against a real uvicorn, every
commit in this process is held back 2 s: if any commit still ran after the response, the reads below,
made the moment the response arrives, would miss the write.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

HELD_BACK_S = 2.0
_holding_back = threading.Event()


def _hold_back(session: Session) -> None:
    if _holding_back.is_set():
        time.sleep(HELD_BACK_S)


@pytest.fixture
def slow_commits() -> Iterator[None]:
    """Every commit in this process waits 2 s while the test runs. The listener stays registered once
    the test ends (idle): removing it while the server thread commits would break SQLAlchemy's iteration."""
    if not event.contains(Session, "before_commit", _hold_back):
        event.listen(Session, "before_commit", _hold_back)
    _holding_back.set()
    try:
        yield
    finally:
        _holding_back.clear()


def _sign_in(browser: httpx.Client, token: str) -> None:
    form = browser.get("/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert form.status_code == 401 and nonce is not None
    signed_in = browser.post("/login", data={"token": token, "next": "/", "nonce": nonce.group(1)})
    assert signed_in.status_code == 303, signed_in.text[:500]


def test_a_signed_in_browser_is_signed_in_on_its_very_next_request(live_server: str, token: str,
                                                                    slow_commits: None) -> None:
    with httpx.Client(base_url=live_server, timeout=60) as browser:
        _sign_in(browser, token)
        runs = browser.get("/")
        assert runs.status_code == 200, "the sign-in was not committed when its 303 arrived"
        assert 'id="runs"' in runs.text


def test_a_signed_out_session_is_refused_on_its_very_next_request(live_server: str, token: str,
                                                                  slow_commits: None) -> None:
    with httpx.Client(base_url=live_server, timeout=60) as browser:
        _sign_in(browser, token)
        cookie = browser.cookies["crucible_token"]
        signed_out = browser.get("/logout")
        assert signed_out.status_code == 303
        replayed = httpx.get(f"{live_server}/", cookies={"crucible_token": cookie}, timeout=60)
        assert replayed.status_code == 401, "the sign-out was not committed when its 303 arrived"
