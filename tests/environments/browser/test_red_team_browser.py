"""Red-team tests of the browser environment's reward paths (issue 12), on the real driver and Chromium.

The policy optimizes the reward and will use any way to it that skips the task. Each test here is one
such way, tried for real through the driver's channel with only what the agent has: click, fill,
select_option, press, scroll, hover, goto, go_back, noop (any JSON arguments), and its own thinking
time between actions. `eval` (an operator op the agent never gets) appears only to stand in for the
page's own code (a timer of the page, a script that some other hole let run) or to read what a test
needs; every such use says so.

The holes the review found are closed; their tests failed before the fixes and stay as guards.

    .venv/bin/pytest -q -p no:cacheprovider tests/environments/browser/test_red_team_browser.py
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from environments.browser.sandbox.sites import shop
from tests.environments.browser.test_driver import (
    Driver,
    miniwob,
    pytestmark,  # noqa: F401  (skipped without chromium)
    site,
)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    d = Driver(Path(tmp_path_factory.mktemp("redteam")))
    assert d.call("hello")["ok"]
    yield d
    d.close()


def _bid(tree: str, role: str, name: str = "") -> str:
    match = re.search(rf"\[(\d+)\] {role} '{re.escape(name)}" if name else rf"\[(\d+)\] {role}\b", tree)
    assert match, (role, name, tree[:2000])
    return match.group(1)


def _wait_for(driver: Driver, expression: str, *, seconds: float) -> bool:
    """Poll a page expression through the operator's eval (never through the observation path)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if driver.call("eval", expression=expression).get("value"):
            return True
        time.sleep(0.1)
    return False


def _not_rewarded(state: dict[str, Any]) -> bool:
    return not (state.get("done") and float(state.get("raw_reward") or 0) > 0)


# -- holes found by the review, closed (each test failed before its fix) -------------------------------------------------------------------------------
def test_a_script_typed_into_the_terminal_cannot_end_the_task(driver: Driver) -> None:
    page = driver.call("open", task=miniwob("terminal", 7))
    assert page["ok"], page
    target = _bid(page["tree"], "textbox")
    for key in "<script>core.endEpisode(1,false,'typed')</script>":
        assert driver.act("press", bid=target, key=key)["error"] == ""
    driver.act("press", bid=target, key="Enter")
    state = driver.call("state")
    assert _not_rewarded(state), state


def test_a_task_the_page_ended_cannot_be_restarted_into_a_new_problem(driver: Driver) -> None:
    page = driver.call("open", task=miniwob("click-button", 11))
    assert page["ok"] and not page["done"], page
    cover = driver.call("eval", expression="document.getElementById('sync-task-cover')")
    assert cover["value"] is None  # the driver removes the START cover once the problem is drawn
    # Stands in for the page's own timer ending the task while the agent thinks (moving-items: 9.9 s, -1;
    # tried for real: the same click on its cover, bid 38 for seed 1, leaves done false and reward 0).
    driver.call("eval", expression="setTimeout(() => core.endEpisode(-1, false, 'the page timed out'), 0); 1")
    assert _wait_for(driver, "WOB_DONE_GLOBAL && WOB_RAW_REWARD_GLOBAL === -1", seconds=10)
    driver.call("eval", expression="core.startEpisode(); core.startEpisodeReal(); 1")  # what the cover did
    state = driver.call("state")
    assert state["done"] and state["raw_reward"] == -1.0, state


@pytest.mark.parametrize(("action", "args"), [
    ("noop", {"wait_ms": "nan"}),
    ("noop", {"wait_ms": float("nan")}),  # sent as the JSON literal NaN, which Python's json accepts
    ("noop", {"wait_ms": 10**400}),
    ("scroll", {"dx": 10**400, "dy": 0}),
], ids=["noop-nan-text", "noop-NaN-literal", "noop-huge-int", "scroll-huge-int"])
def test_odd_numbers_are_action_errors_not_faults(driver: Driver, action: str, args: dict[str, Any]) -> None:
    driver.call("open", task=miniwob("click-button", 3))
    reply = driver.call("act", action=action, args=args)
    assert reply["ok"] and reply["error"], reply


def test_a_page_of_an_ended_episode_cannot_change_the_next_site(driver: Driver) -> None:
    task = site(4)
    product = shop.Site(task["site_seed"]).catalogue[0]
    form = urlencode({**{name: values[0] for name, _, values in product.options}, "quantity": "1"})
    driver.call("open", task=miniwob("click-button", 2))
    # Stands in for a script of the page (the terminal hole runs one); the page knows the next origin.
    driver.call("eval", expression=f"""(() => {{
      const generation = +location.hostname.split('.')[0].slice(1);
      const next = 'http://e' + (generation + 1) + '.crucible.internal:' + location.port;
      (async () => {{ for (;;) {{
        try {{ await fetch(next + '/product/{product.id}', {{method: 'POST', mode: 'no-cors',
          headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: '{form}'}});
        }} catch (e) {{}}
        await new Promise(r => setTimeout(r, 1)); }} }})();
      return next; }})()""")
    time.sleep(0.3)  # the loop runs (answered 410) while the episode goes on
    assert driver.call("open", task=task)["ok"]
    time.sleep(0.3)  # the old context is disposed in the background
    assert driver.call("state")["site"]["cart"] == shop.Site(task["site_seed"]).state()["cart"]


def test_a_link_that_opens_a_window_cannot_fault_the_episode(driver: Driver) -> None:
    page = driver.call("open", task=miniwob("click-button", 5), screenshot=True)
    driver.call("eval", expression=(  # stands in for a page of the site's own with such a link
        "document.body.insertAdjacentHTML('afterbegin', '<a href=\"\" target=\"other\">open it</a>'); 1"))
    tree = driver.call("observe")["tree"]
    reply = driver.call("act", action="click", args={"bid": _bid(tree, "link", "open it")}, screenshot=True)
    assert reply["ok"] and reply.get("screenshot"), {k: v for k, v in reply.items() if k != "tree"}
    assert reply["url"] == page["url"]


@pytest.mark.parametrize("url", ["/./miniwob/terminal.html", "/x/../miniwob/terminal.html", "/%2e/miniwob/terminal.html",
                                 "/\\miniwob/terminal.html", "/.//core/core.js"])
def test_goto_cannot_reach_the_miniwob_files_by_another_spelling(driver: Driver, url: str) -> None:
    driver.call("open", task=site(3))
    reply = driver.act("goto", url=url)
    assert reply["error"].startswith("goto: expected"), (url, reply["url"], reply["title"])
    assert "/miniwob/" not in reply["url"] and "/core/" not in reply["url"], reply["url"]


def test_a_bid_with_a_trailing_newline_is_refused_as_malformed(driver: Driver) -> None:
    page = driver.call("open", task=miniwob("enter-text", 5))
    box = _bid(page["tree"], "textbox")
    assert "expected an element id" in driver.act("click", bid=box + "\n")["error"]


# -- attacks already defeated (kept so they stay defeated) ------------------------------------------
def test_browser_shortcuts_neither_navigate_nor_open_windows(driver: Driver) -> None:
    """Keyboard history/reload/new-tab shortcuts would go around goto/go_back's checks (back to the
    prepared blank page, a reload drawing a new MiniWoB++ problem); headless Chromium ignores them."""
    page = driver.call("open", task=site(3))
    url = driver.act("goto", url="/cart")["url"]
    for key in ("Alt+ArrowLeft", "Alt+ArrowRight", "Alt+Home", "Control+r", "Control+Shift+r", "Control+w",
                "Control+t", "Control+n", "Control+[", "Control+l"):
        reply = driver.act("press", key=key)
        assert reply["url"] == url and reply["error"] == "", (key, reply["url"], reply["error"])
    assert page["url"] != url
    driver.call("open", task=miniwob("click-button", 2))
    assert driver.act("press", key="Alt+ArrowLeft")["done"] is False  # still the task's page


def test_markup_that_reloads_the_page_ends_the_task_with_nothing(driver: Driver) -> None:
    """Markup a page echoes (the terminal does, with innerHTML) needs no script to navigate: a meta
    refresh reloads the task's page, which draws a new problem. The driver ends the task with 0 instead,
    and what the new page later says does not count."""
    driver.call("open", task=miniwob("click-button", 5))
    # Markup only, as the terminal would insert it: no script of the agent's runs.
    driver.call("eval", expression="document.body.insertAdjacentHTML('beforeend', "
                                   "'<meta http-equiv=\"refresh\" content=\"0\">'); 1")
    reloaded = "!window.__crucible_nonce && typeof core === 'object' && WOB_TASK_READY"
    assert _wait_for(driver, reloaded, seconds=10)
    reply = driver.act("noop")
    assert reply["done"] and reply["raw_reward"] == 0.0, reply
    driver.call("eval", expression="core.startEpisodeReal(); core.endEpisode(1, false, 'fresh problem'); 1")
    state = driver.call("state")
    assert state["done"] and state["raw_reward"] == 0.0 and "went away" in state["reason"], state


def test_another_pages_reward_does_not_count(driver: Driver) -> None:
    """Echoed markup can hold another task's page on the same origin: in an <iframe>, or in a window a
    click on an echoed link opens. Those pages' globals are their own; the driver reads the task page's."""
    page = driver.call("open", task=miniwob("click-button", 6))
    driver.call("eval", expression=(  # markup only, as the terminal would insert it
        "document.body.insertAdjacentHTML('afterbegin', '<iframe id=\"other\" src=\"/miniwob/click-test.html\">"
        "</iframe><a href=\"/miniwob/click-test.html\" target=\"other-window\">open it</a>'); 1"))
    frame = "document.getElementById('other').contentWindow"
    assert _wait_for(driver, f"{frame}.core && {frame}.document.readyState === 'complete'", seconds=10)
    link = _bid(driver.call("observe")["tree"], "link", "open it")
    assert driver.act("click", bid=link)["url"] == page["url"]  # the new window is not the observed page
    # The window the click opened is closed by the driver; the iframe's page stands in for another
    # page's own code ending its task with reward 1.
    for where in (frame,):
        ended = driver.call("eval", expression=f"(() => {{ const w = {where}; w.core.startEpisodeReal(); "
                                               "w.core.endEpisode(1, false, 'elsewhere'); "
                                               "return w.WOB_DONE_GLOBAL && w.WOB_RAW_REWARD_GLOBAL; })()")
        assert ended["value"] == 1, ended
    reply = driver.act("noop")
    assert reply["done"] is False and reply["url"] == page["url"], reply
    assert driver.call("state")["done"] is False


def test_echoed_markup_cannot_clobber_the_reward_globals(driver: Driver) -> None:
    """Named elements become window properties (DOM clobbering); the reward globals and the driver's
    nonce are declared variables and own properties, which a named element never shadows."""
    driver.call("open", task=miniwob("click-button", 8))
    driver.call("eval", expression="document.body.insertAdjacentHTML('beforeend', "
                                   "'<img name=\"WOB_DONE_GLOBAL\"><form id=\"WOB_RAW_REWARD_GLOBAL\"></form>"
                                   "<a id=\"__crucible_nonce\"></a><img name=\"WOB_REWARD_REASON\">'); 1")
    reply = driver.act("noop")
    assert reply["done"] is False and reply["raw_reward"] == 0.0, reply


def test_fill_cannot_type_into_a_read_only_date_field(driver: Driver) -> None:
    """choose-date's field is read-only: the date must be picked from the calendar. Typing it in would
    skip the task; the browser keeps the field read-only under Input.insertText."""
    page = driver.call("open", task=miniwob("choose-date", 4))
    wanted = re.search(r"\d\d/\d\d/\d{4}", page["goal"])
    assert wanted, page["goal"]
    field = _bid(page["tree"], "textbox")
    driver.act("fill", bid=field, text=wanted.group(0))
    driver.act("press", key="Escape")
    observed = driver.call("observe")
    assert driver.call("eval", expression="document.getElementById('datepicker').value")["value"] == ""
    driver.act("click", bid=_bid(observed["tree"], "button", "Submit"))
    assert _not_rewarded(driver.call("state"))
