"""Tool calls out of completion text. Hermes style (Qwen2.5, our tiny models):

    <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>

One parser per style in PARSERS; environments pick one by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from environments.base import ToolCall


def hermes_call(name: str, **arguments: object) -> str:
    """The text of one Hermes-style call, as `parse_hermes` reads it (scripted policies and expert plans
    write their actions with it)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class MalformedToolCall(ValueError):
    """The policy tried to call a tool but the call cannot be read; the message is its feedback."""


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> ToolCall | None:
    """The first tool call in `text`, None when there is none."""
    match = _HERMES.search(text)
    if match is None:
        if "<tool_call>" in text:
            raise MalformedToolCall("tool call: expected <tool_call>{...}</tool_call>, got an unclosed <tool_call>")
        return None
    try:
        data = json.loads(match.group(1))
    except json.JSONDecodeError as error:
        raise MalformedToolCall(f"tool call: expected JSON inside <tool_call>, got a parse error: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise MalformedToolCall('tool call: expected {"name": "...", "arguments": {...}}')
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # some models double-encode
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise MalformedToolCall("tool call: expected arguments to be a JSON object") from None
    if not isinstance(arguments, dict):
        raise MalformedToolCall(f"tool call: expected arguments to be an object, got {type(arguments).__name__}")
    return ToolCall(name=data["name"], arguments=arguments)


def _parse_browsergym(text: str) -> ToolCall | None:
    from environments.browser.actions import parse_browsergym  # it builds on parse_hermes

    return parse_browsergym(text)


PARSERS: dict[str, Callable[[str], ToolCall | None]] = {"hermes": parse_hermes, "browsergym": _parse_browsergym}
"""`browsergym`: BrowserGym's text actions (`click("12")`) or Hermes calls (environments/browser/actions.py)."""
