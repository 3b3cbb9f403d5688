"""Dashboard fixtures: the API served by uvicorn on a loopback port, and Debian's headless Chromium
driven by Playwright (`executable_path`; no browser is downloaded)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from core.net import free_port
from tests.api.conftest import anonymous, app, client, seeded, token  # noqa: F401  (shared fixtures)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(scope="session")
def live_server(app: FastAPI) -> Iterator[str]:  # noqa: F811
    """The app under uvicorn in a thread on 127.0.0.1, one per session; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on 127.0.0.1:{port}")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium)")
    playwright_api = pytest.importorskip("playwright.sync_api")
    playwright_api.expect.set_options(timeout=60_000)  # the pages' bound (below) for expect(…) too (its own: 5 s)
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, live_server: str) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """A fresh browser context (empty profile, no cookies) whose requests must all stay on the server."""
    context = browser.new_context(base_url=live_server, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)  # an upper bound on each wait, not a timed assertion: a loaded machine took over 15 s
    page.foreign_requests = []
    page.console_errors = []
    page.on("request", lambda request: None if request.url.startswith((live_server, "data:"))
            else page.foreign_requests.append(request.url))
    page.on("console", lambda message: page.console_errors.append(message.text) if message.type == "error" else None)
    yield page
    context.close()


def sign_in(page, secret: str, *, shot: str | None = None) -> None:  # type: ignore[no-untyped-def]
    """Sign in through the form and wait for the runs list it lands on. (Waiting for the URL would not
    do: the form is served at `/` too, so the next step could start before the sign-in had landed.)"""
    response = page.goto("/")
    assert response.status == 401  # nothing but /healthz answers without a token: the form comes with a 401
    if shot:
        screenshot(page, shot)
    page.fill("#token", secret)
    page.click("#login-submit")
    page.wait_for_selector("#runs")
    page.console_errors.clear()  # the browser logs the login page's own 401


def screenshot(page, name: str) -> Path:  # type: ignore[no-untyped-def]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
