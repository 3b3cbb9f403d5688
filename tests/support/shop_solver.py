"""A scripted shop customer for tests: plays a shop task through the browser's actions (goto, select,
click, fill), reading each page's accessibility tree from the prompt, from the task's own check (the
test knows the answer; the agent never sees the check). Each turn resolves the next intent against the
latest page, so bids are looked up where they are, not guessed."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from environments.parsing import hermes_call

Intent = tuple[str, ...]
LABELS = {"full_name": "Full name", "street": "Street and number", "city": "City", "postcode": "Postcode"}


def intents(check: dict[str, Any]) -> list[Intent]:
    out: list[Intent] = []
    for line in check["lines"]:
        out.append(("goto", f"/product/{line['product_id']}"))
        out += [("option", name.capitalize(), value) for name, value in line["options"].items()]
        out += [("fill", "spinbutton", "Quantity", str(line["quantity"])), ("click", "button", "Add to cart")]
    out.append(("goto", "/checkout"))
    ship = check["shipping"]
    out += [("fill", "textbox", label, ship[key]) for key, label in LABELS.items()]
    out += [("select", "Country", ship["country"]), ("radio_prefix", ship["method"].capitalize()),
            ("click", "button", "Place order")]
    return out


def _latest_tree(prompt: str) -> str:
    return prompt[prompt.rfind("# Page"):]


def _find(tree: str, role: str, name: str, *, prefix: bool = False) -> str:
    pattern = rf"\[(\d+)\] {re.escape(role)} '{re.escape(name)}" + ("" if prefix else "'")
    match = re.search(pattern, tree)
    if match is None:
        raise AssertionError(f"no {role} {name!r} on the page:\n{tree[:3000]}")
    return match.group(1)


def resolve(intent: Intent, tree: str) -> str:
    kind = intent[0]
    if kind == "goto":
        return hermes_call("goto", url=intent[1])
    if kind == "option":  # a drop-down (select) or a radio group, whichever the product page has
        label, value = intent[1], intent[2]
        if re.search(rf"\] combobox '{re.escape(label)}'", tree):
            return hermes_call("select_option", bid=_find(tree, "combobox", label), option=value)
        return hermes_call("click", bid=_find(tree, "radio", value))
    if kind == "fill":
        return hermes_call("fill", bid=_find(tree, intent[1], intent[2]), text=intent[3])
    if kind == "select":
        return hermes_call("select_option", bid=_find(tree, "combobox", intent[1]), option=intent[2])
    if kind == "radio_prefix":
        return hermes_call("click", bid=_find(tree, "radio", intent[1], prefix=True))
    return hermes_call("click", bid=_find(tree, intent[1], intent[2]))


def customer(check: dict[str, Any]) -> Callable[[str], str]:
    plan = intents(check)

    def step(prompt: str) -> str:
        turn = prompt.count("<|im_start|>assistant") - 1
        return resolve(plan[min(turn, len(plan) - 1)], _latest_tree(prompt))

    return step


def turns_needed(check: dict[str, Any]) -> int:
    return len(intents(check))
