r"""The browser driver inside a browser sandbox: one Chromium, the task's site, and a JSON-lines channel.

The worker starts it with `docker exec` as the keeper uid (not the agent's: the pool's reset, which
kills the agent's processes, leaves it and its Chromium running) and talks to it over the exec's
attached stdin/stdout, as it talks to the shell driver; nothing listens on a port the page could
reach but the site itself. Standard library only (Debian's python3 in the image).

    host -> driver   {"id": 1, "op": "open", "task": {...}, "screenshot": true}\n
    driver -> host   {"id": 1, "ok": true, "url": ..., "tree": ..., "goal": ..., ...}\n
                     {"id": 1, "ok": false, "fault": "..."}\n  (the machine's fault: Chromium died, ...)

Ops: hello, open (reset to a task), act (one action), observe, state (the site's state, for the
verifier), eval (operators and tests only; never offered to the agent), relaunch (kill and start
Chromium: the baseline the benchmark compares reset with), quit.

Reset. Chromium stays up for the sandbox's life. Every episode runs in its own browser context (an
incognito-like profile: cookies, storage, cache, service workers are the context's own) and is
served from its own origin (`http://e<N>.crucible.internal:<port>`, mapped to 127.0.0.1 inside
Chromium), so a request still in flight from the last episode's page can never reach this episode's
site: it is answered 410. The next context is prepared while the current episode runs (created,
attached, its renderer started on the next origin), so `open` only switches to it, makes the site
and loads the page; the old context is disposed in the background. `open` checks the new context
holds no cookies before it is used.

Sites. MiniWoB++ pages are served from /opt/crucible/miniwob (the `miniwob` package's html folder),
started with the task's seed and a long page timer (turn limits are the environment's), their own
reward read after every action. Apps (sites/shop.py, ...) are Python objects made fresh from the
task's seed at every open; their state is read through this channel, never through the page.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = Path(__file__).resolve().parent.name

from . import axtree
from .cdp import CHROMIUM, CdpError, Chromium
from .sites import SITES

PROTOCOL = 1
MINIWOB_DIR = Path(os.environ.get("CRUCIBLE_MINIWOB_DIR", "/opt/crucible/miniwob"))
DOMAIN = "crucible.internal"
MAX_REQUEST = 16 << 20
MAX_TREE = 200_000
MAX_TEXT = 10_000
ACTION_TIMEOUT = 5.0
STATIC_PREFIXES = ("/miniwob/", "/core/", "/common/", "/flight/")
BID = re.compile(r"[a-zA-Z]?[0-9]{1,9}\Z")
MINIWOB_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")
HIDE_HUMAN_DISPLAY = """(() => {
  for (const id of ['reward-display', 'click-canvas', 'sync-task-cover']) {
    const el = document.getElementById(id); if (el) el.style.display = 'none';
  }
})()"""
KEYS = {  # name -> (windowsVirtualKeyCode, code, text)
    "Enter": (13, "Enter", "\r"), "Tab": (9, "Tab", ""), "Escape": (27, "Escape", ""),
    "Backspace": (8, "Backspace", ""), "Delete": (46, "Delete", ""), "Space": (32, "Space", " "),
    "ArrowUp": (38, "ArrowUp", ""), "ArrowDown": (40, "ArrowDown", ""), "ArrowLeft": (37, "ArrowLeft", ""),
    "ArrowRight": (39, "ArrowRight", ""), "Home": (36, "Home", ""), "End": (35, "End", ""),
    "PageUp": (33, "PageUp", ""), "PageDown": (34, "PageDown", ""),
}
MODIFIERS = {"Alt": 1, "Control": 2, "Meta": 4, "Shift": 8}
KEYS_HELP = "Enter, Tab, Escape, Backspace, Delete, Space, arrows, Home, End, PageUp, PageDown or one character"


class ActionError(Exception):
    """The agent's action was wrong (no such element, not a text field, ...): shown to the agent."""


class Fault(Exception):
    """The machine's fault (Chromium died, the page never answered): the episode is retried."""


def _number(value: Any, *, what: str) -> float:
    """A finite number from the agent's arguments (NaN, infinities, 400-digit integers, text: refused)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ActionError(f"{what}: expected a number, got {json.dumps(value)[:40]}") from None
    if isinstance(value, bool) or number != number or number in (float("inf"), float("-inf")):
        raise ActionError(f"{what}: expected a finite number, got {json.dumps(value)[:40]}")
    return number


# -- the sites' server ------------------------------------------------------------------------------
class SiteServer:
    """Serves MiniWoB++'s static files and the current episode's app on 127.0.0.1 (any port)."""

    def __init__(self) -> None:
        self.generation = 0
        self.app: Any = None
        self.nonce = secrets.token_hex(16)
        """This episode's script nonce: only scripts of the pages we serve carry it (see _static)."""
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.handle(self, "GET")

            def do_POST(self) -> None:
                server.handle(self, "POST")

            def do_HEAD(self) -> None:
                server.handle(self, "HEAD")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a page that went away mid-response (a closed context): nothing to report

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, name="sites", daemon=True).start()

    def origin(self, generation: int) -> str:
        return f"http://e{generation}.{DOMAIN}:{self.port}"

    def handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        try:
            status, headers, body = self._route(request, method)
        except Exception:  # an app's bug is a 500 page, never a dead server
            status, headers, body = 500, {"Content-Type": "text/plain"}, b"internal error"
        request.send_response(status)
        for key, value in _with_charset(headers).items():
            request.send_header(key, value)
        request.send_header("Content-Length", str(len(body)))
        if "Cache-Control" not in headers:
            request.send_header("Cache-Control", "no-store")
        request.end_headers()
        if method != "HEAD":
            request.wfile.write(body)

    def _route(self, request: BaseHTTPRequestHandler, method: str) -> tuple[int, dict[str, str], bytes]:
        host = (request.headers.get("Host") or "").split(":")[0]
        with self.lock:
            current, app, nonce = self.generation, self.app, self.nonce
        if request.path == "/__crucible/blank" and host == f"e{current + 1}.{DOMAIN}":
            return 200, {"Content-Type": "text/html"}, BLANK  # the next episode's tab, prepared now
        if host != f"e{current}.{DOMAIN}":
            return 410, {"Content-Type": "text/plain"}, b"this page belongs to an episode that has ended"
        origin = request.headers.get("Origin")
        if origin is not None and origin != self.origin(current):
            return 403, {"Content-Type": "text/plain"}, b"cross-origin requests are refused"
        parts = urlsplit(request.path)
        path = parts.path
        if path == "/__crucible/blank":
            return 200, {"Content-Type": "text/html"}, BLANK
        if path.startswith(STATIC_PREFIXES):
            if app is not None:  # a site's episode never serves MiniWoB++ pages (their scripts would run there)
                return 404, {"Content-Type": "text/plain"}, b"not found"
            return _static(path, nonce=nonce)
        if app is None:
            return 404, {"Content-Type": "text/plain"}, b"not found"
        form: dict[str, list[str]] = {}
        if method == "POST":
            length = int(request.headers.get("Content-Length") or 0)
            if length > 1 << 20:
                return 413, {"Content-Type": "text/plain"}, b"request too large"
            raw = request.rfile.read(length).decode("utf-8", "replace")
            form = parse_qs(raw, keep_blank_values=True, max_num_fields=1000)
        cookies: dict[str, str] = {}
        for item in (request.headers.get("Cookie") or "").split(";"):
            if "=" in item:
                key, value = item.split("=", 1)
                cookies[key.strip()] = value.strip()
        query = parse_qs(parts.query, keep_blank_values=True, max_num_fields=1000)
        with self.lock:
            if self.app is not app:
                return 410, {"Content-Type": "text/plain"}, b"this page belongs to an episode that has ended"
            status, headers, body = app.handle(method if method != "HEAD" else "GET", path, query, form, cookies)
        if "Content-Security-Policy" not in headers:  # apps here are server-rendered: no script of theirs runs
            headers = {**headers, "Content-Security-Policy": APP_CSP}
        return status, headers, body


# Text without a declared charset is decoded by Chromium as windows-1252: MiniWoB++'s unicode-test asks
# to click "ãƒ˜ãƒ«ãƒ—" for ヘルプ, and no typed non-ASCII text ever matches. Every file MiniWoB++ ships is
# UTF-8 (tests/environments/browser/test_driver.py checks), as is everything this server writes.
TEXT_TYPES = ("text/", "application/json", "application/javascript", "image/svg+xml")


def _with_charset(headers: dict[str, str]) -> dict[str, str]:
    kind = headers.get("Content-Type", "")
    if kind.startswith(TEXT_TYPES) and "charset=" not in kind.lower():
        return {**headers, "Content-Type": f"{kind}; charset=utf-8"}
    return headers


# The page a prepared tab waits on: it puts MiniWoB++'s shared files in the new context's HTTP cache
# (fetched, not run), so the next task's page loads only its own file.
BLANK = ("<!doctype html><title>ready</title>" + "".join(
    f'<link rel="preload" href="{href}" as="{kind}">' for href, kind in (
        ("/core/core.js", "script"), ("/core/core.css", "style"), ("/common/ui_utils.js", "script"),
        ("/core/d3.v3.min.js", "script"), ("/core/jquery-ui/external/jquery/jquery.js", "script"),
        ("/core/jquery-ui/jquery-ui.min.css", "style"), ("/core/jquery-ui/jquery-ui.min.js", "script")))).encode()
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png",
                 ".gif": "image/gif", ".jpg": "image/jpeg", ".svg": "image/svg+xml", ".json": "application/json",
                 ".ttf": "font/ttf", ".woff": "font/woff", ".woff2": "font/woff2"}


# Text the agent types can reach a page's HTML (MiniWoB++'s terminal writes each command with innerHTML):
# markup with an event handler would run the agent's code in the page, and the page's code decides
# the reward. So every MiniWoB++ page is served under a script nonce that only its own <script> tags
# carry: injected handlers, javascript: URLs and inserted scripts do not run, and no eval (jQuery runs
# a <script> in inserted markup with eval; _open_miniwob also disables that path).
SCRIPT_TAG = re.compile(rb"<script\b", re.IGNORECASE)
APP_CSP = "script-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'"


def _static(path: str, *, nonce: str) -> tuple[int, dict[str, str], bytes]:
    root = MINIWOB_DIR.resolve()
    target = (root / path.lstrip("/")).resolve()
    if root not in target.parents or not target.is_file():
        return 404, {"Content-Type": "text/plain"}, b"not found"
    kind = CONTENT_TYPES.get(target.suffix, "application/octet-stream")
    if kind != "text/html":
        return 200, {"Content-Type": kind, "Cache-Control": "max-age=86400"}, target.read_bytes()
    body = SCRIPT_TAG.sub(f'<script nonce="{nonce}"'.encode(), target.read_bytes())
    csp = f"script-src 'nonce-{nonce}'; object-src 'none'; base-uri 'none'"
    return 200, {"Content-Type": "text/html", "Content-Security-Policy": csp}, body


# -- tabs -------------------------------------------------------------------------------------------
class Tab:
    """One browser context with one page, attached."""

    def __init__(self, browser: Chromium, *, generation: int, origin: str, viewport: tuple[int, int]) -> None:
        self.browser = browser
        self.generation = generation
        self.origin = origin
        self.context = browser.call("Target.createBrowserContext", disposeOnDetach=False)["browserContextId"]
        self.target = browser.call("Target.createTarget", url="about:blank", browserContextId=self.context)["targetId"]
        self.session = browser.call("Target.attachToTarget", targetId=self.target, flatten=True)["sessionId"]
        self.viewport = viewport
        for method, params in (("Page.enable", {}), ("Runtime.enable", {}),
                               ("Emulation.setDeviceMetricsOverride", {"width": viewport[0], "height": viewport[1],
                                                                      "deviceScaleFactor": 1, "mobile": False})):
            browser.call(method, session=self.session, **params)
        self.navigate(f"{origin}/__crucible/blank")
        cookies = browser.call("Storage.getCookies", browserContextId=self.context).get("cookies", [])
        if cookies:
            raise Fault(f"a new browser context held {len(cookies)} cookies")

    def call(self, method: str, *, timeout: float = ACTION_TIMEOUT, **params: Any) -> dict[str, Any]:
        return self.browser.call(method, session=self.session, timeout=timeout, **params)

    def navigate(self, url: str, *, timeout: float = 15.0) -> str | None:
        """Load `url` and wait for its load event; the navigation's error text, if any."""
        self.browser.drain(self.session)
        result = self.call("Page.navigate", url=url, timeout=timeout)
        if result.get("errorText"):
            return str(result["errorText"])
        if result.get("loaderId") and self.browser.wait_event(
                self.session, {"Page.loadEventFired"}, timeout=timeout) is None:
            raise Fault(f"the page {url} did not load in {timeout:g} s")
        return None

    def evaluate(self, expression: str, *, await_promise: bool = False, timeout: float = ACTION_TIMEOUT) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=await_promise, timeout=timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "error")
            raise ActionError(f"the page raised: {str(text)[:300]}")
        return result.get("result", {}).get("value")

    def dispose(self) -> None:
        with contextlib.suppress(CdpError):
            self.browser.call("Target.disposeBrowserContext", browserContextId=self.context, timeout=10)
        self.browser.forget(self.session)


# -- the driver -------------------------------------------------------------------------------------
class Driver:
    def __init__(self) -> None:
        self.server = SiteServer()
        self.browser: Chromium | None = None
        self.profile = ""
        self.tab: Tab | None = None
        self.task: dict[str, Any] = {}
        self.viewport = (800, 600)
        self.dialogs: list[str] = []
        self._next: Tab | None = None
        self._next_error: BaseException | None = None
        self._preparing: threading.Thread | None = None
        self._miniwob_nonce = ""
        self._ended: dict[str, Any] | None = None

    # -- browser lifecycle ------------------------------------------------------------------------
    def _ensure_browser(self) -> Chromium:
        if self.browser is None or not self.browser.alive():
            self._drop_browser()
            scratch = os.environ.get("CRUCIBLE_KEEPER_DIR") or tempfile.gettempdir()
            for name in ("HOME", "TMPDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
                if os.environ.get(name):
                    os.makedirs(os.environ[name], mode=0o700, exist_ok=True)
            self.profile = tempfile.mkdtemp(prefix="crucible-chromium-", dir=scratch)
            self.browser = Chromium.launch(
                user_data_dir=self.profile, executable=os.environ.get("CRUCIBLE_CHROMIUM", CHROMIUM),
                extra=(f"--host-resolver-rules=MAP *.{DOMAIN} 127.0.0.1, EXCLUDE localhost",),
                # One renderer for the site, reused across navigations: a new process per navigation
                # (site isolation, back-forward cache, proactive process swaps) costs ~100 ms each.
                disable_features=("IsolateOrigins", "site-per-process", "BackForwardCache",
                                  "ProactivelySwapBrowsingInstance", "RenderDocument"),
                log_path=os.path.join(self.profile, "chromium.log"))
            self.browser.listeners.append(self._on_event)
            self.browser.call("Target.setDiscoverTargets", discover=True)
        return self.browser

    def _drop_browser(self) -> None:
        self._await_prepared(discard=True)
        self.tab = None
        if self.browser is not None:
            self.browser.kill()
            self.browser = None
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)
            self.profile = ""

    def _on_event(self, message: dict[str, Any]) -> None:
        if message.get("method") == "Target.targetCreated" and self.browser is not None:
            info = message.get("params", {}).get("targetInfo", {})
            if info.get("type") == "page" and info.get("openerId"):  # a window a page opened: closed, the
                self.browser.send("Target.closeTarget", {"targetId": info.get("targetId")})  # task stays in front
            return
        if message.get("method") == "Page.javascriptDialogOpening" and self.browser is not None:
            params = message.get("params", {})
            self.dialogs.append(f"{params.get('type', 'dialog')}: {str(params.get('message', ''))[:200]}")
            self.browser.send("Page.handleJavaScriptDialog", {"accept": True}, session=message.get("sessionId"))

    def _prepare(self, generation: int) -> None:
        """Make the next episode's tab (runs on a thread while the current episode goes on)."""
        try:
            browser = self._ensure_browser()
            self._next = Tab(browser, generation=generation, origin=self.server.origin(generation),
                             viewport=self.viewport)
        except BaseException as error:  # reported by the open that wanted it
            self._next_error = error

    def _start_preparing(self, generation: int) -> None:
        self._next, self._next_error = None, None
        self._preparing = threading.Thread(target=self._prepare, args=(generation,), name="prepare", daemon=True)
        self._preparing.start()

    def _await_prepared(self, *, discard: bool = False) -> Tab | None:
        if self._preparing is not None:
            self._preparing.join(60)
            self._preparing = None
        tab, self._next = self._next, None
        if discard and tab is not None:
            tab.dispose()
            return None
        return tab

    # -- ops --------------------------------------------------------------------------------------
    def op_hello(self, request: dict[str, Any]) -> dict[str, Any]:
        browser = self._ensure_browser()
        if self.tab is None and self._preparing is None and self._next is None:
            self._start_preparing(self.server.generation + 1)
        version = browser.call("Browser.getVersion")
        return {"protocol": PROTOCOL, "chromium": version.get("product", ""), "port": self.server.port}

    def op_open(self, request: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        task = request.get("task")
        if not isinstance(task, dict):
            raise ActionError("open: expected a task object")
        viewport = request.get("viewport") or [800, 600]
        viewport = (int(viewport[0]), int(viewport[1]))
        if viewport != self.viewport:  # a prepared tab of another size is of no use
            self.viewport = viewport
            self._await_prepared(discard=True)
        generation = self.server.generation + 1
        tab = self._await_prepared()
        if tab is None or tab.generation != generation or not tab.browser.alive():
            if tab is not None:
                tab.dispose()
            if self._next_error is not None and not isinstance(self._next_error, (CdpError, Fault)):
                sys.stderr.write("".join(traceback.format_exception(self._next_error)))
            self._prepare(generation)
            tab, self._next = self._next, None
            if tab is None:
                raise Fault(f"could not open a browser context: {self._next_error}")
        app = None
        family = task.get("family")
        if family == "site":
            site = SITES.get(str(task.get("site")))
            if site is None:
                raise ActionError(f"open: expected a site in {sorted(SITES)}, got {task.get('site')!r}")
            app = site(int(task.get("site_seed", 0)))
        elif family != "miniwob":
            raise ActionError(f"open: expected family miniwob or site, got {family!r}")
        old = self.tab
        with self.server.lock:  # from here on only this episode's origin is served
            self.server.generation, self.server.app = generation, app
            self.server.nonce = secrets.token_hex(16)
        self.tab, self.task, self.dialogs, self._ended = tab, task, [], None
        prepared = time.perf_counter()
        if family == "miniwob":
            goal = self._open_miniwob(tab, task)
        else:
            path = str(task.get("start_path") or "/")
            if not path.startswith("/") or path.startswith("//"):
                raise ActionError(f"open: expected start_path to start with one '/', got {path!r}")
            error = tab.navigate(tab.origin + path)
            if error:
                raise Fault(f"the site's first page did not load: {error}")
            goal = str(task.get("goal", ""))
        loaded = time.perf_counter()
        reply = self._observation(screenshot=bool(request.get("screenshot")))
        reply.update(goal=goal, timings={"switch": prepared - started, "load": loaded - prepared,
                                         "observe": time.perf_counter() - loaded,
                                         "open": time.perf_counter() - started})
        # The next episode's tab is made now, while this one runs; the old context goes with it.
        threading.Thread(target=lambda: old.dispose() if old else None, name="dispose", daemon=True).start()
        self._start_preparing(generation + 1)
        return reply

    def _open_miniwob(self, tab: Tab, task: dict[str, Any]) -> str:
        name = str(task.get("name", ""))
        if not MINIWOB_NAME.match(name) or not (MINIWOB_DIR / "miniwob" / f"{name}.html").is_file():
            raise ActionError(f"open: expected a MiniWoB++ task name, got {name!r}")
        seed = int(task.get("seed", 0))
        error = tab.navigate(f"{tab.origin}/miniwob/{name}.html")
        if error:
            raise Fault(f"the MiniWoB++ page did not load: {error}")
        self._miniwob_nonce = secrets.token_hex(8)
        started = tab.evaluate(  # one round trip: hide the human display, seed, start, wait until ready
            f"""(async () => {{
              {HIDE_HUMAN_DISPLAY};
              window.__crucible_nonce = {json.dumps(self._miniwob_nonce)};
              Math.seedrandom({json.dumps(str(seed))});
              core.EPISODE_MAX_TIME = 1e9;
              core.startEpisodeReal();
              // One problem per episode: the START cover (shown again when a task ends) cannot draw a
              // new one, and jQuery runs no <script> found in markup the agent typed.
              core.startEpisode = core.startEpisodeReal = function () {{}};
              if (core.cover_div) core.cover_div.remove();
              if (window.jQuery) jQuery.globalEval = function () {{}};
              for (let i = 0; i < 200 && !WOB_TASK_READY; i++) await new Promise(r => setTimeout(r, 25));
              return [WOB_TASK_READY, String(core.getUtterance())];
            }})()""", await_promise=True, timeout=15)
        if not started or not started[0]:
            raise Fault(f"the MiniWoB++ task {name} did not become ready")
        return started[1]

    def op_act(self, request: dict[str, Any]) -> dict[str, Any]:
        tab = self._tab()
        started = time.perf_counter()
        action = str(request.get("action", ""))
        args = request.get("args") or {}
        if not isinstance(args, dict):
            raise ActionError("expected the action's arguments as an object")
        error = ""
        self.dialogs = []
        try:
            handler = getattr(self, f"_do_{action}", None)
            if handler is None:
                raise ActionError(f"unknown action {action!r}")
            handler(tab, args)
        except ActionError as problem:
            error = str(problem)
        acted = time.perf_counter()
        self._settle(tab)
        settled = time.perf_counter()
        reply = self._observation(screenshot=bool(request.get("screenshot")))
        reply["error"] = error
        if self.dialogs:
            reply["dialogs"] = list(self.dialogs)
        reply["timings"] = {"action": acted - started, "settle": settled - acted,
                            "observe": time.perf_counter() - settled, "step": time.perf_counter() - started}
        return reply

    def op_observe(self, request: dict[str, Any]) -> dict[str, Any]:
        self._tab()
        return self._observation(screenshot=bool(request.get("screenshot")))

    def op_state(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.server.lock:
            app = self.server.app
        return {"site": app.state() if app is not None else None, **self._miniwob_status()}

    def op_eval(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"value": self._tab().evaluate(str(request.get("expression", "")), await_promise=True)}

    def op_relaunch(self, request: dict[str, Any]) -> dict[str, Any]:
        """Kill Chromium and start it again with a fresh context on the current task's page: what a
        reset costs the way BrowserGym does it (the benchmark's baseline)."""
        started = time.perf_counter()
        self._drop_browser()
        self._ensure_browser()
        launched = time.perf_counter()
        opened = self.op_open({"task": request.get("task") or self.task, "viewport": list(self.viewport)})
        return {"timings": {"launch": launched - started, "open": opened["timings"]["open"],
                            "relaunch": time.perf_counter() - started}, "url": opened["url"]}

    def op_quit(self, request: dict[str, Any]) -> dict[str, Any]:
        self._drop_browser()
        return {"bye": True}

    # -- actions ----------------------------------------------------------------------------------
    def _tab(self) -> Tab:
        if self.tab is None:
            raise ActionError("no page is open (open a task first)")
        if self.browser is None or not self.browser.alive():
            raise Fault("the browser is gone")
        return self.tab

    def _element(self, tab: Tab, args: dict[str, Any]) -> dict[str, Any]:
        bid = args.get("bid")
        if not isinstance(bid, str) or not BID.match(bid):
            raise ActionError(f"expected an element id (bid) like \"12\", got {json.dumps(bid)[:40]}")
        info = tab.evaluate(f"""(() => {{
          const e = document.querySelector('[bid="{bid}"]');
          if (!e) return null;
          e.scrollIntoView({{block: 'center', inline: 'center'}});
          const r = e.getBoundingClientRect(), s = getComputedStyle(e);
          const tag = e.tagName.toLowerCase(), type = (e.getAttribute('type') || '').toLowerCase();
          return {{tag, type, x: r.left + r.width / 2, y: r.top + r.height / 2, w: r.width, h: r.height,
                   visible: r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none',
                   disabled: !!e.disabled, editable: e.isContentEditable || tag === 'textarea' ||
                     (tag === 'input' && !['checkbox','radio','submit','button','reset','file','image','hidden']
                       .includes(type))}};
        }})()""")
        if info is None:
            raise ActionError(f"no element with bid {bid!r} on this page")
        info["bid"] = bid
        return info

    def _visible(self, info: dict[str, Any]) -> dict[str, Any]:
        if not info["visible"]:
            raise ActionError(f"element {info['bid']} is not visible")
        return info

    def _mouse(self, tab: Tab, kind: str, x: float, y: float, **extra: Any) -> None:
        tab.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)

    def _do_click(self, tab: Tab, args: dict[str, Any]) -> None:
        info = self._visible(self._element(tab, args))
        self._mouse(tab, "mouseMoved", info["x"], info["y"])
        self._mouse(tab, "mousePressed", info["x"], info["y"], button="left", buttons=1, clickCount=1)
        self._mouse(tab, "mouseReleased", info["x"], info["y"], button="left", buttons=0, clickCount=1)

    def _do_hover(self, tab: Tab, args: dict[str, Any]) -> None:
        info = self._visible(self._element(tab, args))
        self._mouse(tab, "mouseMoved", info["x"], info["y"])

    def _do_dblclick(self, tab: Tab, args: dict[str, Any]) -> None:
        info = self._visible(self._element(tab, args))
        self._mouse(tab, "mouseMoved", info["x"], info["y"])
        for count in (1, 2):  # Chromium fires dblclick on the second press-release with clickCount 2
            self._mouse(tab, "mousePressed", info["x"], info["y"], button="left", buttons=1, clickCount=count)
            self._mouse(tab, "mouseReleased", info["x"], info["y"], button="left", buttons=0, clickCount=count)

    def _do_focus(self, tab: Tab, args: dict[str, Any]) -> None:
        info = self._visible(self._element(tab, args))
        tab.evaluate(f"document.querySelector('[bid=\"{info['bid']}\"]').focus()")

    def _do_clear(self, tab: Tab, args: dict[str, Any]) -> None:
        self._do_fill(tab, {"bid": args.get("bid"), "text": ""})

    def _do_drag_and_drop(self, tab: Tab, args: dict[str, Any]) -> None:
        """Press on one element, move in steps (drag libraries wait for a few moves), release on another."""
        source = self._visible(self._element(tab, {"bid": args.get("from_bid")}))
        target = self._visible(self._element(tab, {"bid": args.get("to_bid")}))
        if source["bid"] == target["bid"]:
            raise ActionError(f"drag_and_drop: expected two different elements, got {source['bid']} twice")
        # The target's position once the source is scrolled into view (scrolling one moves the other).
        target = self._element(tab, {"bid": target["bid"]})
        source = self._element(tab, {"bid": source["bid"]})

        def past(start: float, middle: float, size: float) -> float:
            """A little past the target's middle in the direction of travel, as a hand drops: sortable
            lists move an item only once the pointer crosses the middle of the one it goes over."""
            return middle + (min(size / 4, 8.0) if middle > start else -min(size / 4, 8.0) if middle < start else 0.0)

        self._drag(tab, (source["x"], source["y"]), (past(source["x"], target["x"], target["w"]),
                                                     past(source["y"], target["y"], target["h"])))

    def _drag(self, tab: Tab, start: tuple[float, float], end: tuple[float, float], steps: int = 8) -> None:
        (x0, y0), (x1, y1) = start, end
        self._mouse(tab, "mouseMoved", x0, y0)
        self._mouse(tab, "mousePressed", x0, y0, button="left", buttons=1, clickCount=1)
        for step in range(1, steps + 1):
            self._mouse(tab, "mouseMoved", x0 + (x1 - x0) * step / steps, y0 + (y1 - y0) * step / steps,
                        button="left", buttons=1)
        self._mouse(tab, "mouseReleased", x1, y1, button="left", buttons=0, clickCount=1)

    def _point(self, args: dict[str, Any], x: str, y: str, *, action: str) -> tuple[float, float]:
        px, py = _number(args.get(x), what=f"{action}: {x}"), _number(args.get(y), what=f"{action}: {y}")
        width, height = self.viewport
        if not (0 <= px < width and 0 <= py < height):
            raise ActionError(f"{action}: expected a point inside the {width}x{height} page, got ({px:g}, {py:g})")
        return px, py

    def _do_mouse_click(self, tab: Tab, args: dict[str, Any]) -> None:
        x, y = self._point(args, "x", "y", action="mouse_click")
        self._mouse(tab, "mouseMoved", x, y)
        self._mouse(tab, "mousePressed", x, y, button="left", buttons=1, clickCount=1)
        self._mouse(tab, "mouseReleased", x, y, button="left", buttons=0, clickCount=1)

    def _do_mouse_drag_and_drop(self, tab: Tab, args: dict[str, Any]) -> None:
        start = self._point(args, "from_x", "from_y", action="mouse_drag_and_drop")
        end = self._point(args, "to_x", "to_y", action="mouse_drag_and_drop")
        self._drag(tab, start, end)

    def _do_fill(self, tab: Tab, args: dict[str, Any]) -> None:
        text = args.get("text", args.get("value"))
        if not isinstance(text, str):
            raise ActionError(f"fill: expected text as a string, got {json.dumps(text)[:40]}")
        if len(text) > MAX_TEXT:
            raise ActionError(f"fill: expected at most {MAX_TEXT} characters, got {len(text)}")
        info = self._visible(self._element(tab, args))
        if info["tag"] == "select":
            raise ActionError(f"element {info['bid']} is a drop-down list: use select_option")
        if not info["editable"]:
            raise ActionError(f"element {info['bid']} is a {info['tag']}, not a text field")
        if info["disabled"]:
            raise ActionError(f"element {info['bid']} is disabled")
        bid = info["bid"]
        if info["type"] in ("date", "time", "datetime-local", "month", "week", "color", "range"):
            tab.evaluate(f"""(() => {{ const e = document.querySelector('[bid="{bid}"]'); e.focus();
              e.value = {json.dumps(text)}; e.dispatchEvent(new Event('input', {{bubbles: true}}));
              e.dispatchEvent(new Event('change', {{bubbles: true}})); }})()""")
            return
        tab.evaluate(f"""(() => {{ const e = document.querySelector('[bid="{bid}"]'); e.focus();
          if (e.select) e.select(); else {{ const r = document.createRange(); r.selectNodeContents(e);
            const s = getSelection(); s.removeAllRanges(); s.addRange(r); }} }})()""")
        self._key(tab, "Delete", 0)
        if text:
            tab.call("Input.insertText", text=text)

    def _do_select_option(self, tab: Tab, args: dict[str, Any]) -> None:
        info = self._visible(self._element(tab, args))
        option = args.get("option", args.get("options"))
        wanted = [option] if isinstance(option, str) else option
        if not isinstance(wanted, list) or not wanted or not all(isinstance(o, str) for o in wanted):
            raise ActionError(f"select_option: expected an option's text, got {json.dumps(option)[:60]}")
        if info["tag"] != "select":
            raise ActionError(f"element {info['bid']} is a {info['tag']}, not a drop-down list")
        result = tab.evaluate(f"""(() => {{
          const e = document.querySelector('[bid="{info['bid']}"]'), wanted = {json.dumps(wanted)};
          const opts = Array.from(e.options), norm = s => s.trim().replace(/\\s+/g, ' ');
          const pick = w => opts.find(o => norm(o.label) === norm(w)) || opts.find(o => o.value === w)
                         || opts.find(o => norm(o.label).toLowerCase() === norm(w).toLowerCase());
          const found = wanted.map(pick);
          if (found.some(o => !o)) return opts.map(o => norm(o.label));
          if (!e.multiple && found.length > 1) return 'single';
          for (const o of opts) o.selected = found.includes(o);
          e.dispatchEvent(new Event('input', {{bubbles: true}}));
          e.dispatchEvent(new Event('change', {{bubbles: true}}));
          return true;
        }})()""")
        if result == "single":
            raise ActionError(f"element {info['bid']} takes one option, got {len(wanted)}")
        if result is not True:
            listed = ", ".join(json.dumps(o) for o in (result or [])[:30])
            raise ActionError(f"select_option: expected one of {listed}, got {json.dumps(option)[:60]}")

    def _do_press(self, tab: Tab, args: dict[str, Any]) -> None:
        combo = args.get("key")
        if not isinstance(combo, str) or not combo:
            raise ActionError(f"press: expected a key like \"Enter\" or \"Control+a\", got {json.dumps(combo)[:40]}")
        *mods, key = combo.split("+") if combo != "+" else ["+"]
        mask = 0
        for mod in mods:
            if mod not in MODIFIERS:
                raise ActionError(f"press: expected modifiers among {', '.join(MODIFIERS)}, got {mod!r}")
            mask |= MODIFIERS[mod]
        if key not in KEYS and len(key) != 1:
            raise ActionError(f"press: expected {KEYS_HELP}, got {key!r}")
        if args.get("bid") is not None:
            info = self._visible(self._element(tab, args))
            tab.evaluate(f"document.querySelector('[bid=\"{info['bid']}\"]').focus()")
        self._key(tab, key, mask)

    def _key(self, tab: Tab, key: str, mask: int) -> None:
        if key in KEYS:
            code, name, text = KEYS[key]
            key_name = " " if key == "Space" else key
        else:
            text, name, key_name = key, f"Key{key.upper()}" if key.isalpha() else "", key
            code = ord(key.upper()) if key.isalnum() and key.isascii() else 0
        if mask & ~MODIFIERS["Shift"]:
            text = ""  # a shortcut types nothing
        common: dict[str, Any] = {"key": key_name, "code": name, "windowsVirtualKeyCode": code, "modifiers": mask}
        tab.call("Input.dispatchKeyEvent", type="keyDown" if text else "rawKeyDown", text=text, **common)
        tab.call("Input.dispatchKeyEvent", type="keyUp", **common)

    def _do_scroll(self, tab: Tab, args: dict[str, Any]) -> None:
        dx, dy = _number(args.get("dx", 0), what="scroll: dx"), _number(args.get("dy", 0), what="scroll: dy")
        if not all(-10000 <= v <= 10000 for v in (dx, dy)):
            raise ActionError(f"scroll: expected dx and dy within ±10000, got {dx:g}, {dy:g}")
        self._mouse(tab, "mouseWheel", self.viewport[0] / 2, self.viewport[1] / 2, deltaX=dx, deltaY=dy)

    def _do_goto(self, tab: Tab, args: dict[str, Any]) -> None:
        url = args.get("url")
        if not self.task.get("navigation", False):
            raise ActionError("goto is not available in this task")
        if not isinstance(url, str) or len(url) > 2048:
            raise ActionError(f"goto: expected a URL on {tab.origin}, got {json.dumps(url)[:80]}")
        target = tab.origin + url if url.startswith("/") and not url.startswith("//") else url
        parts = urlsplit(target)
        # As Chromium will resolve it (dots, %2e, backslashes, doubled slashes) before checking the prefix.
        path = "/" + posixpath.normpath("/" + unquote(parts.path).replace("\\", "/")).lstrip("/")
        if f"{parts.scheme}://{parts.netloc}" != tab.origin or (path + "/").startswith(STATIC_PREFIXES):
            raise ActionError(f"goto: expected a URL on this site ({tab.origin}/...), got {url[:120]!r}")
        error = tab.navigate(target, timeout=ACTION_TIMEOUT * 2)
        if error:
            raise ActionError(f"goto: the page did not load ({error})")

    def _do_go_back(self, tab: Tab, args: dict[str, Any]) -> None:
        if not self.task.get("navigation", False):
            raise ActionError("go_back is not available in this task")
        history = tab.call("Page.getNavigationHistory")
        index = int(history.get("currentIndex", 0))
        entries = history.get("entries", [])
        if index <= 0 or not entries[index - 1].get("url", "").startswith(tab.origin + "/") or \
                entries[index - 1]["url"].startswith(tab.origin + "/__crucible/"):
            raise ActionError("go_back: there is no earlier page")
        self.browser.drain(tab.session) if self.browser else None
        tab.call("Page.navigateToHistoryEntry", entryId=entries[index - 1]["id"])
        self.browser.wait_event(tab.session, {"Page.loadEventFired"}, timeout=ACTION_TIMEOUT) if self.browser else None

    def _do_noop(self, tab: Tab, args: dict[str, Any]) -> None:
        wait_ms = _number(args.get("wait_ms", 0), what="noop: wait_ms")
        time.sleep(min(max(wait_ms, 0.0), 5000.0) / 1000)

    # -- observing --------------------------------------------------------------------------------
    def _settle(self, tab: Tab) -> None:
        """Wait for what the action started: a navigation's load, then one rendered frame."""
        frame = "new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))"
        with contextlib.suppress(ActionError, CdpError):  # the document went away: a navigation, waited for below
            tab.evaluate(frame, await_promise=True)
        assert self.browser is not None
        events = self.browser.drain(tab.session)
        started = any(e.get("method") in ("Page.frameStartedLoading", "Page.frameRequestedNavigation")
                      and e.get("params", {}).get("frameId") == tab.target for e in events)
        loaded = any(e.get("method") == "Page.loadEventFired" for e in events)
        if started and not loaded:
            self.browser.wait_event(tab.session, {"Page.loadEventFired"}, timeout=ACTION_TIMEOUT * 2)
            with contextlib.suppress(ActionError, CdpError):
                tab.evaluate(frame, await_promise=True)

    def _observation(self, *, screenshot: bool) -> dict[str, Any]:
        tab = self._tab()
        page = None
        for _ in range(3):  # a page mid-navigation has no document to mark yet
            try:
                page = tab.evaluate(f"({axtree.MARK_BIDS}, [location.href, document.title])")
                break
            except (ActionError, CdpError):
                self.browser.wait_event(tab.session, {"Page.loadEventFired"}, timeout=1.0) if self.browser else None
        if page is None:
            raise Fault("the page never settled enough to be observed")
        assert self.browser is not None
        snap_id = self.browser.send("DOMSnapshot.captureSnapshot", {"computedStyles": []}, session=tab.session)
        ax_id = self.browser.send("Accessibility.getFullAXTree", {}, session=tab.session)
        shot_id = (self.browser.send("Page.captureScreenshot", {"format": "png"}, session=tab.session)
                   if screenshot else None)
        snapshot = self.browser.wait(snap_id, method="DOMSnapshot.captureSnapshot", timeout=ACTION_TIMEOUT)
        nodes = self.browser.wait(ax_id, method="Accessibility.getFullAXTree", timeout=ACTION_TIMEOUT)["nodes"]
        bids, clickable = axtree.bid_map(snapshot)
        tree = axtree.render(nodes, bids, clickable)
        if len(tree) > MAX_TREE:
            tree = tree[:MAX_TREE] + f"\n[... {len(tree) - MAX_TREE} characters cut ...]"
        url, title = page[0], page[1]
        reply: dict[str, Any] = {"url": url, "title": title, "tree": tree}
        if shot_id is not None:
            try:
                reply["screenshot"] = self.browser.wait(shot_id, method="Page.captureScreenshot", timeout=10)["data"]
            except CdpError as error:  # a page the agent made unpaintable: no picture, not a fault
                reply["screenshot_error"] = str(error)[:200]
        reply.update(self._miniwob_status())
        return reply

    def _miniwob_status(self) -> dict[str, Any]:
        if self.task.get("family") != "miniwob" or self.tab is None:
            return {}
        if self._ended is not None:
            return dict(self._ended)
        try:
            status = self.tab.evaluate(
                "({nonce: window.__crucible_nonce || '', done: !!WOB_DONE_GLOBAL || WOB_EPISODE_ID > 0,"
                " raw: WOB_RAW_REWARD_GLOBAL,"
                " reward: WOB_REWARD_GLOBAL, reason: WOB_REWARD_REASON === null ? '' : String(WOB_REWARD_REASON)})")
        except (ActionError, CdpError):
            status = None
        if not isinstance(status, dict) or status.get("nonce") != self._miniwob_nonce:
            # The task's page is gone (it navigated away): the episode is over with what it had.
            self._ended = {"done": True, "raw_reward": 0.0, "page_reward": 0.0, "reason": "the task's page went away"}
            return dict(self._ended)
        result = {"done": bool(status["done"]), "raw_reward": float(status["raw"] or 0.0),
                  "page_reward": float(status["reward"] or 0.0), "reason": str(status["reason"])[:300]}
        if result["done"]:
            self._ended = result  # the first verdict stands: the page cannot be restarted into another
        return result


def serve(stdin: Any = None, stdout: Any = None) -> None:
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    driver = Driver()
    while True:
        line = stdin.readline(MAX_REQUEST + 1)
        if not line:
            break
        reply: dict[str, Any]
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("expected an object")
        except ValueError as error:
            reply = {"id": None, "ok": False, "fault": f"bad request: {error}"}
        else:
            op = str(request.get("op", ""))
            handler = getattr(driver, f"op_{op}", None)
            try:
                if handler is None:
                    raise ActionError(f"unknown op {op!r}")
                reply = {"ok": True, **handler(request)}
            except ActionError as error:
                reply = {"ok": False, "error": str(error)}
            except (Fault, CdpError, OSError) as error:
                reply = {"ok": False, "fault": f"{type(error).__name__}: {error}"}
            except Exception as error:  # a bug of ours: a fault, with the trace on stderr
                traceback.print_exc()
                reply = {"ok": False, "fault": f"{type(error).__name__}: {error}"}
            reply["id"] = request.get("id")
            if op == "quit":
                stdout.write(json.dumps(reply).encode() + b"\n")
                stdout.flush()
                break
        stdout.write(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
        stdout.flush()
    driver._drop_browser()


if __name__ == "__main__":
    serve()
