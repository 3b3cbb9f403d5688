"""A scripted MiniWoB++ player (the expert of the browser warm-up, tests and benchmarks): reads the goal and the accessibility tree out of the prompt the
policy was given (exactly what a model sees) and returns the next tool call, for the tasks in SOLVERS.

Each solver plans every action from the opening page (bids are stable while an element lives); turn k
plays plan[k]. `wrong` plays a deliberately wrong first action where one exists (the page says -1).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from environments.parsing import hermes_call

Plan = list[str]


def _goal(prompt: str) -> str:
    match = re.search(r"# Goal\n(.*)\n", prompt)
    return match.group(1) if match else ""


def _opening_tree(prompt: str) -> str:
    start = prompt.find("# Page")
    end = prompt.find("<|im_end|>", start)
    return prompt[start:end]


def _bid(tree: str, role: str, name: str) -> str:
    match = re.search(rf"\[(\d+)\] {re.escape(role)} '{re.escape(name)}'", tree)
    if match is None:
        raise AssertionError(f"no {role} {name!r} in:\n{tree}")
    return match.group(1)


def _bids(tree: str, role: str) -> list[str]:
    return re.findall(rf"\[(\d+)\] {re.escape(role)} ", tree)


def _quoted(goal: str) -> list[str]:
    return re.findall(r'"([^"]*)"', goal)


def click_button(goal: str, tree: str) -> Plan:
    return [hermes_call("click", bid=_bid(tree, "button", _quoted(goal)[0]))]


def click_link(goal: str, tree: str) -> Plan:
    name = _quoted(goal)[0]
    match = re.search(rf"\[(\d+)\] (?:generic|link) '{re.escape(name)}'", tree)
    assert match, tree
    return [hermes_call("click", bid=match.group(1))]


def click_test(goal: str, tree: str) -> Plan:
    return [hermes_call("click", bid=_bid(tree, "button", "Click Me!"))]


def click_test_2(goal: str, tree: str) -> Plan:
    return [hermes_call("click", bid=_bid(tree, "button", re.search(r"button (\w+)\.", goal).group(1)))]  # type: ignore[union-attr]


def click_dialog(goal: str, tree: str) -> Plan:
    return [hermes_call("click", bid=_bid(tree, "button", "Close"))]


def focus_text(goal: str, tree: str) -> Plan:
    return [hermes_call("click", bid=_bids(tree, "textbox")[0])]


def enter_text(goal: str, tree: str) -> Plan:
    text = re.search(r'Enter "(.*)" into', goal).group(1)  # type: ignore[union-attr]
    return [hermes_call("fill", bid=_bids(tree, "textbox")[0], text=text),
            hermes_call("click", bid=_bid(tree, "button", "Submit"))]


def enter_text_2(goal: str, tree: str) -> Plan:
    match = re.search(r'Type "(.*)" in all (lower|upper) case', goal)
    assert match, goal
    text = match.group(1).lower() if match.group(2) == "lower" else match.group(1).upper()
    return [hermes_call("fill", bid=_bids(tree, "textbox")[0], text=text),
            hermes_call("click", bid=_bid(tree, "button", "Submit"))]


def enter_password(goal: str, tree: str) -> Plan:
    password = _quoted(goal)[0]
    first, second = _bids(tree, "textbox")[:2]
    return [hermes_call("fill", bid=first, text=password), hermes_call("fill", bid=second, text=password),
            hermes_call("click", bid=_bid(tree, "button", "Submit"))]


def login_user(goal: str, tree: str) -> Plan:
    user, password = _quoted(goal)[:2]
    first, second = _bids(tree, "textbox")[:2]
    return [hermes_call("fill", bid=first, text=user), hermes_call("fill", bid=second, text=password),
            hermes_call("press", bid=second, key="Tab"), hermes_call("click", bid=_bid(tree, "button", "Login"))]


def click_checkboxes(goal: str, tree: str) -> Plan:
    wanted = re.search(r"Select (.*) and click Submit", goal).group(1)  # type: ignore[union-attr]
    names = [] if wanted == "nothing" else [n.strip() for n in re.split(r",\s*|\s+and\s+", wanted) if n.strip()]
    return [hermes_call("click", bid=_bid(tree, "checkbox", name)) for name in names] + \
        [hermes_call("click", bid=_bid(tree, "button", "Submit"))]


def click_option(goal: str, tree: str) -> Plan:
    name = re.search(r"Select (.*) and click Submit", goal).group(1)  # type: ignore[union-attr]
    return [hermes_call("click", bid=_bid(tree, "radio", name)), hermes_call("click", bid=_bid(tree, "button", "Submit"))]


def click_tab(goal: str, tree: str) -> Plan:
    number = re.search(r"Tab #(\d+)", goal).group(1)  # type: ignore[union-attr]
    return [hermes_call("click", bid=_bid(tree, "link", f"Tab #{number}"))]


def click_button_sequence(goal: str, tree: str) -> Plan:
    return [hermes_call("click", bid=_bid(tree, "button", "ONE")), hermes_call("click", bid=_bid(tree, "button", "TWO"))]


SOLVERS: dict[str, Callable[[str, str], Plan]] = {
    "click-button": click_button, "click-link": click_link, "click-test": click_test, "click-test-2": click_test_2,
    "click-dialog": click_dialog, "focus-text": focus_text, "enter-text": enter_text, "enter-text-2": enter_text_2,
    "enter-password": enter_password, "login-user": login_user, "click-checkboxes": click_checkboxes,
    "click-option": click_option, "click-tab": click_tab, "click-button-sequence": click_button_sequence,
}


def _list_items(tree: str) -> list[tuple[str, str]]:
    """(bid of the list item, its text) of a sortable list's items, in the page's order."""
    return re.findall(r"\[(\d+)\] listitem ''\n\s+\[\d+\] generic '([^']*)'", tree)


def drag_box(goal: str, tree: str) -> Plan:
    return [hermes_call("drag_and_drop", from_bid=_bid(tree, "generic", "s"), to_bid=_bid(tree, "generic", "L")),
            hermes_call("click", bid=_bid(tree, "button", "Submit"))]


def drag_items(goal: str, tree: str) -> Plan:
    """'Drag NAME to the top.' / 'to the bottom.' / 'up (down) by one position.' / 'to the 3rd position.'"""
    name, where = re.search(r"Drag (.+?) ((?:to|up|down) .*)\.$", goal).groups()  # type: ignore[union-attr]
    items = _list_items(tree)
    now = [text for _, text in items].index(name)
    ordinal = re.search(r"to the (\d+)\w\w position", where)
    target = (0 if where == "to the top" else len(items) - 1 if where == "to the bottom" else
              now - 1 if where.startswith("up") else now + 1 if where.startswith("down") else int(ordinal.group(1)) - 1)  # type: ignore[union-attr]
    return [hermes_call("drag_and_drop", from_bid=items[now][0], to_bid=items[target][0])]


GRID = {"top left": 0, "top center": 1, "top right": 2, "center left": 3, "center": 4, "center right": 5,
        "bottom left": 6, "bottom center": 7, "bottom right": 8}
STEPS = {"up": -3, "down": 3, "left": -1, "right": 1}


def drag_items_grid(goal: str, tree: str) -> Plan:
    """'Drag NAME to the top left.' / 'to the center.' / 'up (down, left, right) by one.' on a 3 x 3 grid."""
    name, where = re.search(r"Drag (.+?) ((?:to the|up|down|left|right) .*)\.$", goal).groups()  # type: ignore[union-attr]
    items = _list_items(tree)
    now = [text for _, text in items].index(name)
    target = GRID[where.removeprefix("to the ")] if where.startswith("to the ") else now + STEPS[where.split()[0]]
    return [hermes_call("drag_and_drop", from_bid=items[now][0], to_bid=items[target][0])]


DRAG_SOLVERS: dict[str, Callable[[str, str], Plan]] = {
    "drag-box": drag_box, "drag-items": drag_items, "drag-items-grid": drag_items_grid,
}
"""Pages that need a drag (BrowserGym's drag_and_drop): kept apart from SOLVERS, whose mix the browser
benchmark and the browser recipe's warm-up use."""


def solver(task: str) -> Callable[[str], str]:
    """A scripted-policy step: the next action of the plan for this prompt."""

    def step(prompt: str) -> str:
        plan = {**SOLVERS, **DRAG_SOLVERS}[task](_goal(prompt), _opening_tree(prompt))
        turn = prompt.count("<|im_start|>assistant") - 1
        return plan[min(turn, len(plan) - 1)]

    return step


def wrong_click(prompt: str) -> str:
    """Click the first button the goal does not name (click-button: the page answers -1)."""
    goal, tree = _goal(prompt), _opening_tree(prompt)
    named = _quoted(goal)[0]
    for bid, name in re.findall(r"\[(\d+)\] button '([^']*)'", tree):
        if name != named:
            return hermes_call("click", bid=bid)
    raise AssertionError(tree)
