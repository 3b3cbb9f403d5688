"""Tool calls out of completion text, one parser per chat-template family (core/renderers.py):

    hermes   <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>   (ChatML: Qwen2.5, our tiny models)
    llama3   {"name": "bash", "parameters": {"command": "ls"}}   (Llama 3.1/3.2; `<|python_tag|>` first is allowed)
    mistral  [TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}}]   (Mistral's Tekken models)

One parser per style in PARSERS; environments pick one by name (`tool_parser`; `auto`, the default, is
the served model's family's). Each returns the first call, None when the text holds none, and raises
MalformedToolCall (its message is the policy's feedback) when a call is begun but cannot be read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

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
    return _call(data, shape='{"name": "...", "arguments": {...}}', arguments_keys=("arguments",))


def _parse_browsergym(text: str) -> ToolCall | None:
    from environments.browser.actions import parse_browsergym  # it builds on parse_hermes

    return parse_browsergym(text)


_LLAMA3_ENDS = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
_LLAMA3_SHAPE = '{"name": "...", "parameters": {...}}'


def parse_llama3(text: str) -> ToolCall | None:
    """Llama 3's JSON call: the whole reply is one object (after an optional `<|python_tag|>`); several
    calls separated by `;` are read as their first. A reply that does not start with `{` holds none."""
    body = text.strip()
    for end in _LLAMA3_ENDS:
        body = body.removesuffix(end).rstrip()
    tagged = body.startswith("<|python_tag|>")
    body = body.removeprefix("<|python_tag|>").lstrip()
    if not body.startswith("{"):
        if tagged:
            raise MalformedToolCall(f"tool call: expected {_LLAMA3_SHAPE} after <|python_tag|>, got {body[:80]!r}")
        return None
    try:
        data, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as error:
        raise MalformedToolCall(f"tool call: expected a JSON object {_LLAMA3_SHAPE}, got a parse error: {error}") from None
    return _call(data, shape=_LLAMA3_SHAPE, arguments_keys=("parameters", "arguments"))


_MISTRAL_SHAPE = '[TOOL_CALLS][{"name": "...", "arguments": {...}}]'


def parse_mistral(text: str) -> ToolCall | None:
    """Mistral's calls: `[TOOL_CALLS]` then a JSON list of calls (or one call), read as the first."""
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return None
    body = text[at + len("[TOOL_CALLS]"):].strip()
    try:
        data, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as error:
        raise MalformedToolCall(f"tool call: expected {_MISTRAL_SHAPE}, got a parse error: {error}") from None
    if isinstance(data, list):
        if not data:
            raise MalformedToolCall(f"tool call: expected {_MISTRAL_SHAPE}, got an empty list")
        data = data[0]
    return _call(data, shape=_MISTRAL_SHAPE, arguments_keys=("arguments",))


def _call(data: object, *, shape: str, arguments_keys: tuple[str, ...]) -> ToolCall:
    """A decoded JSON call as a ToolCall; arguments may be double-encoded (a JSON string)."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise MalformedToolCall(f"tool call: expected {shape}, got {json.dumps(data)[:120]}")
    arguments: Any = next((data[key] for key in arguments_keys if key in data), {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise MalformedToolCall(f"tool call: expected {' or '.join(arguments_keys)} to be a JSON object, "
                                    f"got the string {arguments[:80]!r}") from None
    if not isinstance(arguments, dict):
        raise MalformedToolCall(f"tool call: expected {' or '.join(arguments_keys)} to be an object, "
                                f"got {type(arguments).__name__}")
    call_id = data.get("id")
    return ToolCall(name=data["name"], arguments=arguments, id=call_id if isinstance(call_id, str) else "")


PARSERS: dict[str, Callable[[str], ToolCall | None]] = {
    "hermes": parse_hermes, "llama3": parse_llama3, "mistral": parse_mistral, "browsergym": _parse_browsergym}
"""`browsergym`: BrowserGym's text actions (`click("12")`) or Hermes calls (environments/browser/actions.py)."""
AUTO = "auto"
"""A spec's `tool_parser` default: the parser of the served model's chat-template family."""
