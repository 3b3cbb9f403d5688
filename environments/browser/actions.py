"""BrowserGym's high-level actions for the browser kind: their names, their argument names, and the text
form a BrowserGym agent writes (`tool_parser: browsergym`).

    click("12")   dblclick("12")   hover("12")   focus("7")   clear("7")   fill("7", "Alice")
    select_option("9", "Red")   press("7", "Enter")   scroll(0, 200)   drag_and_drop("3", "8")
    mouse_click(120, 40)   mouse_drag_and_drop(10, 10, 200, 10)   send_msg_to_user("42")   noop(500)
    goto("/cart")   go_back()

The same call as a Hermes tool call, with BrowserGym's argument names (`value`, `options`, `key_comb`,
`delta_x`) or the kind's own (`text`, `option`, `key`, `dx`), is the same action: `canonical` renames
them before the driver sees them. `send_msg_to_user(text)` is BrowserGym's answer: the kind's
`submit(answer)`. Only the left button and no modifier keys are driven; anything else is a tool error.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from environments.base import ToolCall
from environments.parsing import MalformedToolCall, parse_hermes

SIGNATURES: dict[str, tuple[str, ...]] = {
    "click": ("bid", "button", "modifiers"),
    "dblclick": ("bid", "button", "modifiers"),
    "hover": ("bid",),
    "focus": ("bid",),
    "clear": ("bid",),
    "fill": ("bid", "value"),
    "select_option": ("bid", "options"),
    "press": ("bid", "key_comb"),
    "scroll": ("delta_x", "delta_y"),
    "drag_and_drop": ("from_bid", "to_bid"),
    "mouse_click": ("x", "y", "button"),
    "mouse_drag_and_drop": ("from_x", "from_y", "to_x", "to_y"),
    "send_msg_to_user": ("text",),
    "noop": ("wait_ms",),
    "goto": ("url",),
    "go_back": (),
    "submit": ("answer",),
}
"""BrowserGym's parameters of each action, in its positional order (`submit` is the kind's own)."""
RENAMES = {"value": "text", "options": "option", "key_comb": "key", "delta_x": "dx", "delta_y": "dy"}
"""BrowserGym's argument name → the kind's (the tool schemas' and the driver's)."""
MAX_TEXT = 4096
_CONTROL = re.compile(r"<\|[A-Za-z_]+\|>")


def canonical(call: ToolCall) -> ToolCall:
    """`call` with BrowserGym's argument names renamed to the kind's, `send_msg_to_user` as `submit`;
    a button other than the left one or modifier keys: MalformedToolCall (the agent sees why)."""
    arguments = dict(call.arguments)
    button = arguments.pop("button", "left")
    if button != "left":
        raise MalformedToolCall(f"{call.name}: expected button \"left\" (the only one driven), got {button!r:.40}")
    modifiers = arguments.pop("modifiers", [])
    if modifiers not in ([], None):
        raise MalformedToolCall(f"{call.name}: expected no modifiers (press a key combination instead), "
                                f"got {modifiers!r:.60}")
    for old, new in RENAMES.items():
        if old in arguments:
            if new in arguments:
                raise MalformedToolCall(f"{call.name}: expected {old!r} or {new!r}, got both")
            arguments[new] = arguments.pop(old)
    if call.name == "send_msg_to_user":
        return ToolCall("submit", {"answer": arguments.get("text", "")})
    return ToolCall(call.name, arguments)


def browsergym_text(call: ToolCall) -> str:
    """`call` (the kind's argument names or BrowserGym's) as a BrowserGym agent writes it: `fill("7", "Alice")`."""
    back = {new: old for old, new in RENAMES.items()}
    arguments = {back.get(key, key): value for key, value in call.arguments.items()}
    name, answer = ("send_msg_to_user", {"text": arguments["answer"]}) if call.name == "submit" and \
        "answer" in arguments else (call.name, arguments)
    positional: list[str] = []
    for parameter in SIGNATURES[name]:
        if parameter not in answer:
            break
        positional.append(repr(answer.pop(parameter)))
    return f"{name}({', '.join([*positional, *(f'{key}={value!r}' for key, value in answer.items())])})"


def parse_browsergym(text: str) -> ToolCall | None:
    """The first action in `text`: a Hermes tool call if there is one, else the first line that is a
    BrowserGym call like `click("12")` (literal arguments only: nothing is evaluated). None: no action."""
    if "<tool_call>" in text:
        return parse_hermes(text)
    for line in _CONTROL.sub("\n", text).splitlines():  # a stop token the server left in ends a line
        line = line.strip().strip("`").strip()
        name = line.split("(", 1)[0].strip()
        if name not in SIGNATURES or not line.endswith(")"):
            continue
        return _call(line, name)
    return None


def _call(line: str, name: str) -> ToolCall:
    try:
        node = ast.parse(line[:MAX_TEXT * 2], mode="eval").body
    except SyntaxError:
        raise MalformedToolCall(f"action: expected one call like {name}(...), got {line[:80]!r}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise MalformedToolCall(f"action: expected one call like {name}(...), got {line[:80]!r}")
    parameters = SIGNATURES[name]
    if len(node.args) > len(parameters):
        raise MalformedToolCall(f"{name}: expected at most {len(parameters)} arguments "
                                f"({', '.join(parameters) or 'none'}), got {len(node.args)}")
    arguments: dict[str, Any] = {}
    try:
        for parameter, value in zip(parameters, node.args, strict=False):
            arguments[parameter] = ast.literal_eval(value)
        for keyword in node.keywords:
            if keyword.arg is None or keyword.arg not in parameters:
                raise MalformedToolCall(f"{name}: expected arguments among {', '.join(parameters) or 'none'}, "
                                        f"got {keyword.arg!r}")
            if keyword.arg in arguments:
                raise MalformedToolCall(f"{name}: got {keyword.arg!r} twice")
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
    except MalformedToolCall:
        raise
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise MalformedToolCall(f"{name}: expected literal arguments (strings, numbers, lists), "
                                f"got {line[:80]!r}") from None
    return ToolCall(name, arguments)
