"""The observation: the page's accessibility tree as text, with BrowserGym-style element ids (`bid`).

Every element gets a `bid` attribute the first time it is seen (MARK_BIDS), so an id names the same
element for as long as it lives; Chromium's accessibility tree (Accessibility.getFullAXTree) is joined
to the DOM through backend node ids (DOMSnapshot.captureSnapshot), and rendered as BrowserGym does:

    RootWebArea 'Shop'
      [12] link 'Shirts'
      [15] textbox 'Quantity' value='1', required
      [21] button 'Add to cart'
      StaticText 'In stock'

Pruned: ignored nodes and `none` (their children are kept), InlineTextBox and LineBreak, generic
containers that are neither clickable nor hold text of their own (children kept), and static text
that repeats its parent's name. A generic element that holds text (MiniWoB's "links" are spans) is
kept with its bid, so it can be clicked.
"""

from __future__ import annotations

from typing import Any

MARK_BIDS = """(() => {
  let next = window.__crucible_next_bid || 0;
  for (const el of document.querySelectorAll('*')) {
    if (!el.hasAttribute('bid')) el.setAttribute('bid', String(next++));
  }
  window.__crucible_next_bid = next;
  return next;
})()"""

SKIPPED_ROLES = {"InlineTextBox", "LineBreak"}
TRANSPARENT_ROLES = {"none", "presentation"}
GENERIC_ROLES = {"generic", "Section", "div", "paragraph"}  # containers (kept only when they carry something)
SHOWN_PROPERTIES = ("focused", "checked", "pressed", "selected", "expanded", "disabled", "required", "readonly",
                    "invalid", "multiselectable")
VALUE_ROLES = {"textbox", "searchbox", "combobox", "spinbutton", "slider", "ListBox", "listbox", "textField"}
MAX_NAME = 240


def bid_map(snapshot: dict[str, Any]) -> tuple[dict[int, str], set[int]]:
    """(backend node id -> bid, backend ids of clickable nodes) from DOMSnapshot.captureSnapshot."""
    strings = snapshot.get("strings", [])
    bids: dict[int, str] = {}
    clickable: set[int] = set()
    for document in snapshot.get("documents", [])[:1]:  # the main frame; iframes are not addressed
        nodes = document.get("nodes", {})
        backend = nodes.get("backendNodeId", [])
        for index, attributes in enumerate(nodes.get("attributes", [])):
            for k in range(0, len(attributes) - 1, 2):
                if strings[attributes[k]] == "bid":
                    bids[backend[index]] = strings[attributes[k + 1]]
                    break
        for index in nodes.get("isClickable", {}).get("index", []):
            clickable.add(backend[index])
    return bids, clickable


def _text(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_NAME else text[:MAX_NAME] + "…"


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _role(node: dict[str, Any]) -> str:
    """A node's role (`''` when it has none)."""
    return str(node.get("role", {}).get("value", ""))


def _name(node: dict[str, Any]) -> str:
    """A node's accessible name, whitespace collapsed and cut at MAX_NAME."""
    return _text(node.get("name", {}).get("value", "") or "")


def _extras(node: dict[str, Any], role: str, clickable: bool) -> list[str]:
    """What follows a node's name on its line: its value (an input's), the properties that are set, and
    `clickable` for a generic container that is."""
    extras: list[str] = []
    value = node.get("value", {}).get("value")
    if role in VALUE_ROLES and value not in (None, ""):
        extras.append(f"value={_quote(_text(value))}")
    for prop in node.get("properties", []):
        key = prop.get("name")
        if key in SHOWN_PROPERTIES:
            raw = prop.get("value", {}).get("value")
            if raw is True or raw == "true":
                extras.append(key)
            elif key in ("checked", "pressed", "expanded") and raw not in (None, False, "false"):
                extras.append(f"{key}={raw}")
            elif key in ("checked", "expanded") and raw in (False, "false"):
                extras.append(f"{key}=false")
    if clickable and role in GENERIC_ROLES:
        extras.append("clickable")
    return extras


def render(ax_nodes: list[dict[str, Any]], bids: dict[int, str], clickable: set[int]) -> str:
    """The tree as indented text (BrowserGym's flattened format)."""
    by_id = {node["nodeId"]: node for node in ax_nodes}
    roots = [node for node in ax_nodes if not node.get("parentId") or node.get("parentId") not in by_id]
    lines: list[str] = []

    def visit(node: dict[str, Any], depth: int, parent_name: str) -> None:
        role = _role(node)
        children = [by_id[c] for c in node.get("childIds", []) if c in by_id]
        if role in SKIPPED_ROLES:
            return
        name = _name(node)
        backend = node.get("backendDOMNodeId")
        bid = bids.get(backend) if backend is not None else None
        if node.get("ignored") or role in TRANSPARENT_ROLES:
            for child in children:
                visit(child, depth, parent_name)
            return
        if role == "StaticText":
            if name and name != parent_name:
                lines.append("  " * depth + f"StaticText {_quote(name)}")
            return
        if role in GENERIC_ROLES and not name:
            texts = [c for c in children if _role(c) == "StaticText" and _name(c)]
            if len(texts) == 1 and len(children) == 1 and bid is not None:  # a span holding text: keep
                lines.append("  " * depth + f"[{bid}] {role} {_quote(_name(texts[0]))}"
                             + (", clickable" if backend in clickable else ""))
                return
            if backend not in clickable or bid is None:
                for child in children:
                    visit(child, depth, parent_name)
                return
        head = f"[{bid}] " if bid is not None else ""
        line = f"{head}{role} {_quote(name)}" if name or role != "RootWebArea" else role
        extras = _extras(node, role, backend in clickable)
        lines.append("  " * depth + line + (", " + ", ".join(extras) if extras else ""))
        for child in children:
            visit(child, depth + 1, name)

    for root in roots:
        visit(root, 0, "")
    return "\n".join(lines)
