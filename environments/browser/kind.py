"""The browser environment kind: Chromium in the sandbox, BrowserGym-style observations and actions.

    name: miniwob
    kind: browser
    image: browser
    sandbox: {memory: 2g, pids: 1024}
    tools: [click, fill, select_option, press, scroll, hover, noop]
    browser: {viewport: [800, 600], screenshots: every_turn}
    limits: {max_turns: 8, max_context_tokens: 4096, max_response_tokens: 64}

Observation: the goal (in the first message), the page's URL and accessibility tree with element ids
(`[12] button 'Submit'`), and the last action's error. Actions: click(bid), fill(bid, text),
select_option(bid, option), press(bid, key), scroll(dx, dy), hover(bid), dblclick(bid), focus(bid),
clear(bid), drag_and_drop(from_bid, to_bid), mouse_click(x, y), mouse_drag_and_drop(from_x, from_y,
to_x, to_y), goto(url) and go_back (sites only, on the site's own origin), noop(wait_ms),
submit(answer) — BrowserGym's action set, whose argument names (`value`, `options`, `key_comb`) and
`send_msg_to_user(text)` are taken too, and whose text form (`click("12")`) a spec takes with
`tool_parser: browsergym` (environments/browser/actions.py).

An episode ends when the agent submits, when a MiniWoB++ page says its task is done (reason
`submitted`: the page took the agent's last action as its answer), or at a limit. Rewards come from
the sandbox's browser after the episode, read through the driver's channel: a MiniWoB++ page's own
raw reward (in [-1, 1]; partial credit kept; with the spec's `browser.reward: success`, 1 when it is
> 0 and else 0), or the site's verify(check, state) on the app's state.
A wrong bid, a field that is not a text box, a refused URL: a tool error the agent sees. The browser
or its driver failing: a sandbox fault, retried.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any

from core.renderers import HERMES_CALL
from environments.base import (
    Artifact,
    GraderFault,
    Kind,
    LayerResult,
    Opening,
    OpenSandbox,
    Sandbox,
    ToolCall,
    ToolResult,
    ToolStatus,
    Verdict,
    tool_error,
)
from environments.browser.actions import canonical
from environments.browser.config import BrowserSettings
from environments.browser.importing import GENERATED_FORMATS
from environments.browser.sandbox.sites import site_module
from environments.browser.task import BrowserTask
from environments.parsing import MalformedToolCall
from environments.spec import EnvironmentSpec
from sandboxes.errors import ActionRefused

SYSTEM_PROMPT = (
    "You operate a web browser. Each observation is the page's accessibility tree; elements you can act "
    "on carry an id in brackets, like [12]. Use the tools to reach the goal. Call exactly one tool per turn "
    f"as {HERMES_CALL}."
)


BROWSERGYM_PROMPT = (
    "You operate a web browser. Each observation is the page's accessibility tree; elements you can act "
    "on carry an id in brackets, like [12]. Reach the goal with one action per turn, written as a call on "
    "a line of its own, like click(\"12\"), fill(\"7\", \"some text\") or drag_and_drop(\"3\", \"8\")."
)
"""The system prompt of a spec with `tool_parser: browsergym` (BrowserGym's text actions)."""


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_BID = {"type": "string", "description": "The element's id from the tree, e.g. \"12\"."}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "click": _tool("click", "Click an element.", {"bid": _BID}, ["bid"]),
    "fill": _tool("fill", "Replace the text of a text field.", {"bid": _BID, "text": {"type": "string"}},
                  ["bid", "text"]),
    "select_option": _tool("select_option", "Choose an option of a drop-down list by its text.",
                           {"bid": _BID, "option": {"type": "string"}}, ["bid", "option"]),
    "press": _tool("press", "Press a key (Enter, Tab, Backspace, ArrowDown, a character, Control+a, ...) "
                   "in an element.", {"bid": _BID, "key": {"type": "string"}}, ["bid", "key"]),
    "scroll": _tool("scroll", "Scroll the page by dx, dy pixels.",
                    {"dx": {"type": "number"}, "dy": {"type": "number"}}, ["dx", "dy"]),
    "hover": _tool("hover", "Move the mouse over an element.", {"bid": _BID}, ["bid"]),
    "dblclick": _tool("dblclick", "Double-click an element.", {"bid": _BID}, ["bid"]),
    "focus": _tool("focus", "Give an element the keyboard focus.", {"bid": _BID}, ["bid"]),
    "clear": _tool("clear", "Empty a text field.", {"bid": _BID}, ["bid"]),
    "drag_and_drop": _tool("drag_and_drop", "Drag one element and drop it on another.",
                           {"from_bid": _BID, "to_bid": _BID}, ["from_bid", "to_bid"]),
    "mouse_click": _tool("mouse_click", "Click at a point of the page (CSS pixels from its top left corner).",
                         {"x": {"type": "number"}, "y": {"type": "number"}}, ["x", "y"]),
    "mouse_drag_and_drop": _tool("mouse_drag_and_drop", "Press at one point, move to another, release.",
                                 {"from_x": {"type": "number"}, "from_y": {"type": "number"},
                                  "to_x": {"type": "number"}, "to_y": {"type": "number"}},
                                 ["from_x", "from_y", "to_x", "to_y"]),
    "goto": _tool("goto", "Open a URL of this site (a path like /cart).", {"url": {"type": "string"}}, ["url"]),
    "go_back": _tool("go_back", "Go back to the previous page.", {}, []),
    "noop": _tool("noop", "Do nothing (wait for the page).", {"wait_ms": {"type": "number"}}, []),
    "submit": _tool("submit", "Give your answer and end the episode.", {"answer": {"type": "string"}}, []),
    "send_msg_to_user": _tool("send_msg_to_user", "Give your answer (BrowserGym's name for submit).",
                              {"text": {"type": "string"}}, ["text"]),
}


IMAGE = "browser"
"""The image a browser sandbox runs unless its spec names another (environments/images/browser)."""
DEFAULT_TOOLS = ("click", "fill", "select_option", "press", "scroll", "hover", "goto", "go_back", "noop", "submit")
"""What a spec without `tools` offers; BrowserGym's other actions (dblclick, drag_and_drop, …) are offered
when `tools` names them: each schema lengthens every prompt."""


class BrowserKind(Kind):
    name = "browser"
    default_weights = {"page": 1.0, "site_state": 1.0}
    """A MiniWoB++ page's raw reward (`page`) or a site's state check (`site_state`): a task has one of them."""
    config_model = BrowserSettings
    formats = ("crucible", *GENERATED_FORMATS)
    example = '{"family": "miniwob", "name": "click-button", "seed": 0}'

    @staticmethod
    def default_instruction(task: BrowserTask) -> str:
        return task.goal or f"MiniWoB++ task {task.name} (seed {task.seed}); the page states the goal."

    def __init__(self, spec: EnvironmentSpec) -> None:
        self.spec = spec
        self.tool_names = spec.tools or list(DEFAULT_TOOLS)  # a subset: the spec checks (environments/spec.py)
        self.settings: BrowserSettings = spec.kind_config or BrowserSettings()
        self._session: Any = None
        self._opening: dict[str, Any] = {}
        self.page_done = False

    def tools(self) -> list[dict[str, Any]]:
        return [TOOL_SCHEMAS[name] for name in self.tool_names]

    def system_prompt(self) -> str:
        return self.spec.system_prompt or (BROWSERGYM_PROMPT if self.spec.tool_parser == "browsergym" else SYSTEM_PROMPT)

    @staticmethod
    def parse_task(payload: dict[str, Any]) -> BrowserTask:
        return BrowserTask.model_validate(payload)

    # -- episode ----------------------------------------------------------------------------------
    def setup(self, *, sandbox: Sandbox, task: BrowserTask) -> None:
        """A fresh browser context on the task's page (the site's state made anew from its seed)."""
        self._session = sandbox.browser()
        try:
            self._opening = self._session.call(
                "open", task=task.driver_payload(), viewport=list(self.settings.viewport),
                screenshot=self.settings.screenshots != "none")
        except ActionRefused as error:  # a task the image cannot serve: not the agent's doing
            raise RuntimeError(f"browser task: {error}") from None
        self.page_done = bool(self._opening.get("done"))

    def opening(self, *, sandbox: Sandbox, task: BrowserTask, instruction: str) -> Opening:
        page = self._opening
        goal = page.get("goal") or task.goal or instruction
        text = f"# Goal\n{goal}\n\n{_page_text(page, tree=self.settings.tree)}"
        artifacts = [Artifact("observation", "text/plain", text.encode())]
        if page.get("screenshot"):
            artifacts.append(Artifact("screenshot", "image/png", base64.b64decode(page["screenshot"])))
        return Opening(text=text, artifacts=tuple(artifacts))

    def execute(self, *, sandbox: Sandbox, call: ToolCall, task: BrowserTask) -> ToolResult:
        if call.name not in self.tool_names:
            return tool_error(f"tool: expected one of {', '.join(self.tool_names)}, got {json.dumps(call.name)}")
        try:  # BrowserGym's argument names and send_msg_to_user (environments/browser/actions.py)
            call = canonical(call)
        except MalformedToolCall as malformed:
            return tool_error(str(malformed))
        if call.name == "submit":
            answer = call.arguments.get("answer", "")
            return ToolResult(observation="submitted", output=json.dumps({"answer": answer})[:4000], exit_code=0,
                              ends_episode=True)
        try:
            page = self._session.call("act", action=call.name, args=dict(call.arguments),
                                      screenshot=self.settings.screenshots == "every_turn")
        except ActionRefused as refused:
            return tool_error(str(refused))
        error = str(page.get("error") or "")
        text = _page_text(page, tree=self.settings.tree)
        if error:
            text = f"Error: {error}\n\n{text}"
        if page.get("dialogs"):
            text = "".join(f"(a dialog was accepted: {d})\n" for d in page["dialogs"]) + text
        self.page_done = bool(page.get("done"))
        if self.page_done:
            text += "\n\nThe page says the task is over."
        artifacts = (Artifact("screenshot", "image/png", base64.b64decode(page["screenshot"])),) \
            if page.get("screenshot") else ()
        timings = page.get("timings", {})
        return ToolResult(observation=text, output=text, exit_code=1 if error else 0,
                          status=ToolStatus.ERROR if error else ToolStatus.OK, duration_s=float(timings.get("step", 0.0)),
                          ends_episode=self.page_done, artifacts=artifacts)

    def verify(self, *, sandbox: Sandbox, task: BrowserTask, submitted: bool, open_sandbox: OpenSandbox,
               actions: Sequence[ToolCall]) -> Verdict:
        """Read the outcome from the sandbox's browser through the driver (never from the agent's words)."""
        if self._session is None:
            raise GraderFault("verify: expected the browser session opened by setup, got none")
        try:
            state = self._session.call("state")
        except ActionRefused as error:
            raise GraderFault(f"verify: the browser would not report its state ({error})") from None
        if task.family == "miniwob":
            done = bool(state.get("done"))
            raw = float(state.get("raw_reward", 0.0)) if done else 0.0
            detail = (f"the page ended the task: raw reward {raw:g}" + (f" ({state.get('reason')})"
                      if state.get("reason") else "")) if done else "the page did not end the task"
            solved = done and raw > 0
            score = (1.0 if solved else 0.0) if self.settings.reward == "success" else raw
            layers = [LayerResult("page", score, solved, detail)]
        else:
            score, reason = site_module(str(task.site)).verify(task.check, state.get("site") or {})
            layers = [LayerResult("site_state", float(score), score >= 1.0, str(reason)[:2000])]
        return Verdict(layers=layers)


def _page_text(page: dict[str, Any], *, tree: str = "crucible") -> str:
    title = page.get("title") or ""
    text = str(page.get("tree", ""))
    return f"# Page\nURL: {page.get('url', '')}" + (f"\nTitle: {title}" if title else "") + \
        f"\n\n{browsergym_tree(text) if tree == 'browsergym' else text}"


_INDENT = re.compile(r"^((?:  )+)", re.MULTILINE)


def browsergym_tree(text: str) -> str:
    """The driver's tree (environments/browser/sandbox/axtree.py) as BrowserGym's flatten_axtree_to_str
    spells it: a tab per level, and a node's value after its name without a comma (`textbox 'Qty'
    value='1', required`)."""
    text = _INDENT.sub(lambda match: "\t" * (len(match.group(1)) // 2), text)
    return text.replace("', value=", "' value=")
