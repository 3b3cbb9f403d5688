"""The in-sandbox browser driver (browserd.py) on the host's real Chromium (no Docker): its channel and
every action argument get the worst values we can think of. Faults stay faults (the episode is
retried), the agent's mistakes are action errors it sees, and nothing reaches beyond the task's site.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from environments.browser.sandbox import axtree
from environments.browser.sandbox.sites import shop
from environments.browser.task import BrowserTask

DRIVER = Path(__file__).resolve().parents[3] / "environments" / "browser" / "sandbox" / "browserd.py"
pytestmark = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (scripts/setup.sh)")


def _miniwob_dir() -> str:
    spec = importlib.util.find_spec("miniwob")
    assert spec is not None and spec.submodule_search_locations
    return str(Path(next(iter(spec.submodule_search_locations))) / "html")


class Driver:
    def __init__(self, tmp: Path) -> None:
        env = {"PATH": os.environ["PATH"], "CRUCIBLE_MINIWOB_DIR": _miniwob_dir(), "CRUCIBLE_KEEPER_DIR": str(tmp),
               "HOME": str(tmp / "home"), "TMPDIR": str(tmp / "tmp")}
        self.process = subprocess.Popen([sys.executable, "-I", str(DRIVER)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.next_id = 0

    def raw(self, line: bytes) -> dict[str, Any]:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(line)
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def call(self, op: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        reply = self.raw(json.dumps({"id": self.next_id, "op": op, **params}).encode() + b"\n")
        assert reply["id"] == self.next_id
        return reply

    def act(self, action: str, **args: Any) -> dict[str, Any]:
        reply = self.call("act", action=action, args=args)
        assert reply["ok"], reply
        return reply

    def close(self) -> None:
        try:
            self.call("quit")
        finally:
            self.process.wait(20)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    d = Driver(tmp_path_factory.mktemp("browserd"))
    assert d.call("hello")["ok"]
    yield d
    d.close()


def miniwob(name: str, seed: int = 1) -> dict[str, Any]:
    return BrowserTask(family="miniwob", name=name, seed=seed).driver_payload()


def site(index: int = 3) -> dict[str, Any]:
    return BrowserTask(family="site", navigation=True, **shop.generate_task(index)).driver_payload()


def test_a_broken_channel_gets_an_answer_not_a_crash(driver: Driver) -> None:
    assert driver.raw(b"not json\n")["fault"].startswith("bad request")
    assert driver.raw(b"[1, 2]\n")["fault"].startswith("bad request")
    assert driver.raw(b'{"id": 5, "op": "__init__"}\n')["error"] == "unknown op '__init__'"
    assert driver.call("open", task="click-button")["error"] == "open: expected a task object"
    assert "expected a MiniWoB++ task name" in driver.call("open", task={"family": "miniwob", "name": "../../etc"})["error"]
    assert "expected family" in driver.call("open", task={"family": "file", "name": "x"})["error"]
    assert driver.call("hello")["ok"]  # still serving


def test_the_tree_names_elements_by_stable_bids(driver: Driver) -> None:
    page = driver.call("open", task=miniwob("click-checkboxes", 2))
    assert page["ok"] and page["goal"].startswith("Select")
    first = page["tree"]
    again = driver.call("observe")["tree"]
    assert first == again  # observing changes nothing, bids included
    bid = first.split("checkbox")[0].rsplit("[", 1)[1].split("]")[0]
    after = driver.act("click", bid=bid)
    assert after["error"] == "" and f"[{bid}] checkbox" in after["tree"] and after["done"] is False


@pytest.mark.parametrize(("action", "args", "expected"), [
    ("click", {"bid": "99999"}, "no element with bid '99999'"),
    ("click", {"bid": "1'] , *, ['x"}, "expected an element id"),
    ("click", {"bid": None}, "expected an element id"),
    ("click", {"bid": "1" * 50}, "expected an element id"),
    ("fill", {"bid": "1", "text": 5}, "expected text as a string"),
    ("fill", {"bid": "1", "text": "x" * 10_001}, "expected at most 10000 characters"),
    ("press", {"bid": "1", "key": "F5"}, "press: expected Enter"),
    ("press", {"bid": "1", "key": "Hyper+a"}, "expected modifiers among"),
    ("press", {"bid": "1", "key": ""}, "press: expected a key"),
    ("scroll", {"dx": "far", "dy": 0}, "scroll: dx: expected a number"),
    ("scroll", {"dx": 0, "dy": 1e300}, "within ±10000"),
    ("scroll", {"dx": float("nan"), "dy": 0}, "expected a finite number"),
    ("noop", {"wait_ms": "soon"}, "noop: wait_ms: expected a number"),
    ("goto", {"url": "/miniwob/click-test.html"}, "goto is not available in this task"),
    ("go_back", {}, "go_back is not available in this task"),
    ("eval", {"expression": "1"}, "unknown action 'eval'"),
    ("_element", {}, "unknown action '_element'"),
])
def test_wrong_actions_are_errors_the_agent_sees(driver: Driver, action: str, args: dict, expected: str) -> None:
    driver.call("open", task=miniwob("click-button", 4))
    reply = driver.call("act", action=action, args=args)
    assert reply["ok"] and expected in reply["error"], reply.get("error")
    assert "RootWebArea" in reply["tree"]  # the page is still there to look at


def test_actions_on_the_wrong_kind_of_element(driver: Driver) -> None:
    page = driver.call("open", task=miniwob("enter-text", 5))
    button = page["tree"].split("] button")[0].rsplit("[", 1)[1]
    box = page["tree"].split("] textbox")[0].rsplit("[", 1)[1]
    assert "not a text field" in driver.act("fill", bid=button, text="x")["error"]
    assert "not a drop-down list" in driver.act("select_option", bid=box, option="x")["error"]
    assert driver.act("fill", bid=box, text="héllo <script>alert(1)</script>")["error"] == ""
    assert "value='héllo <script>alert(1)</script>'" in driver.call("observe")["tree"]


def test_a_site_task_stays_on_its_own_origin(driver: Driver) -> None:
    page = driver.call("open", task=site())
    origin = "/".join(page["url"].split("/")[:3])
    for url in ("file:///etc/passwd", "javascript:alert(1)", "data:text/html,<p>x</p>", "http://127.0.0.1:1/",
                "http://e1.crucible.internal:1/", origin.replace("http:", "https:") + "/", "//evil.test/",
                "/miniwob/click-button.html", "/core/core.js", "chrome://version", "about:blank", "x" * 3000):
        reply = driver.act("goto", url=url)
        assert reply["error"].startswith("goto: expected"), (url, reply["error"])
        assert reply["url"].startswith(origin + "/"), url
    assert driver.act("goto", url="/cart")["url"] == origin + "/cart"
    assert driver.act("go_back")["url"] == origin + "/"
    assert "no earlier page" in driver.act("go_back")["error"]


def test_the_site_state_comes_from_the_app_not_the_page(driver: Driver) -> None:
    task = site(3)
    driver.call("open", task=task)
    state = driver.call("state")["site"]
    assert state == shop.Site(task["site_seed"]).state()
    assert "check" not in task  # the verifier's check never reaches the sandbox


def test_a_dialog_is_accepted_and_reported(driver: Driver) -> None:
    driver.call("open", task=miniwob("click-button", 4))
    driver.call("eval", expression="setTimeout(() => { window.__answer = confirm('Sure?'); }, 0); 1")
    reply = driver.act("noop", wait_ms=200)
    assert driver.call("eval", expression="window.__answer")["value"] is True
    assert reply.get("dialogs") in (None, ["confirm: Sure?"])


def test_render_keeps_text_spans_and_prunes_empty_containers() -> None:
    nodes = [
        {"nodeId": "1", "role": {"value": "RootWebArea"}, "name": {"value": "T"}, "childIds": ["2"],
         "backendDOMNodeId": 1},
        {"nodeId": "2", "parentId": "1", "role": {"value": "generic"}, "name": {"value": ""},
         "childIds": ["3", "5", "7"], "backendDOMNodeId": 2},
        {"nodeId": "3", "parentId": "2", "role": {"value": "generic"}, "name": {"value": ""}, "childIds": ["4"],
         "backendDOMNodeId": 3},
        {"nodeId": "4", "parentId": "3", "role": {"value": "StaticText"}, "name": {"value": "link text"},
         "childIds": ["9"]},
        {"nodeId": "9", "parentId": "4", "role": {"value": "InlineTextBox"}, "name": {"value": "link text"}},
        {"nodeId": "5", "parentId": "2", "role": {"value": "button"}, "name": {"value": "Go 'now'"},
         "childIds": ["6"], "backendDOMNodeId": 5,
         "properties": [{"name": "focused", "value": {"value": True}}, {"name": "disabled", "value": {"value": False}}]},
        {"nodeId": "6", "parentId": "5", "role": {"value": "StaticText"}, "name": {"value": "Go 'now'"}},
        {"nodeId": "7", "parentId": "2", "role": {"value": "textbox"}, "name": {"value": "Name"}, "ignored": False,
         "value": {"value": "a\nb"}, "backendDOMNodeId": 7},
    ]
    bids = {2: "2", 3: "3", 5: "5", 7: "7"}
    text = axtree.render(nodes, bids, clickable=set())
    assert text.splitlines() == [
        "RootWebArea 'T'",
        "  [3] generic 'link text'",
        "  [5] button 'Go \\'now\\'', focused",
        "  [7] textbox 'Name', value='a b'",
    ]


def test_text_a_page_echoes_as_html_cannot_run_script(driver: Driver) -> None:
    """MiniWoB++'s terminal task writes each typed command into the page with innerHTML: typed markup
    with an event handler would run the agent's code in the page, which could end the task with
    reward 1. The driver serves every MiniWoB++ page under a script nonce, so only the page's own
    scripts run."""
    page = driver.call("open", task=miniwob("terminal", 3))
    assert page["ok"], page
    payload = "<img src=x onerror=core.endEpisode(1,false,'hacked')>"
    # The terminal's own input, not the first bid: keys sent before the page's 200 ms autofocus would
    # otherwise reach the body and be lost on a loaded machine.
    found = re.search(r"\[(\d+)\] textbox", page["tree"])
    assert found, page["tree"]
    target = found.group(1)
    for key in payload:
        assert driver.act("press", bid=target, key=key)["error"] == ""
    after = driver.act("press", bid=target, key="Enter")
    state = driver.call("state")
    assert not (state["done"] and state["raw_reward"] > 0), (state, after["tree"][-600:])
    echoed = driver.call("eval", expression="document.querySelector('.terminal-line img') !== null")["value"]
    assert echoed  # the markup did reach the page: only its handler was kept from running


def test_a_non_ascii_goal_reaches_the_agent_as_written_and_its_button_can_be_clicked(driver: Driver) -> None:
    """(issue 24) MiniWoB++'s pages declare no charset; served as bare text/html, Chromium read them as
    windows-1252 and the agent was asked to click "ãƒ˜ãƒ«ãƒ—" for ヘルプ. Each of unicode-test's labels
    is non-ASCII; the goal names one, the tree shows it, clicking it ends the task with the reward."""
    labels = ["ÖK", "Cancél", "♥♥♥", "确定", "取消", "ヘルプ"]
    page = driver.call("open", task=miniwob("unicode-test", 5))
    assert page["ok"], page
    found = re.fullmatch(r'Click on the "(.+)" button\.', page["goal"])
    assert found and found.group(1).lower() in [label.lower() for label in labels], page["goal"]
    wanted = found.group(1)
    button = re.search(rf"\[(\d+)\] button '{re.escape(wanted)}'", page["tree"])
    assert button, page["tree"]
    driver.act("click", bid=button.group(1))
    state = driver.call("state")
    assert state["done"] and state["raw_reward"] > 0, state


def test_every_text_file_miniwob_ships_is_utf8_as_the_driver_declares() -> None:
    from environments.browser.sandbox.browserd import CONTENT_TYPES, TEXT_TYPES

    texts = [path for path in Path(_miniwob_dir()).rglob("*")
             if path.is_file() and CONTENT_TYPES.get(path.suffix, "").startswith(TEXT_TYPES)]
    assert len(texts) > 100
    for path in texts:
        path.read_bytes().decode("utf-8")  # raises, naming the file's bytes, if one is not
