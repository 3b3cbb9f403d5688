"""Tool calls out of completion text: well-formed, absent, and every way of being malformed."""

from __future__ import annotations

import pytest

from environments.parsing import MalformedToolCall, parse_hermes


def test_a_well_formed_call() -> None:
    call = parse_hermes('I will look.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>')
    assert call is not None and (call.name, call.arguments) == ("bash", {"command": "ls"})


def test_double_encoded_arguments_are_accepted() -> None:
    call = parse_hermes('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>')
    assert call is not None and call.arguments == {"command": "pwd"}


def test_no_call_is_none() -> None:
    assert parse_hermes("I am done thinking.") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('<tool_call>{"name": "bash"', "unclosed <tool_call>"),
        ("<tool_call>{name: bash}</tool_call>", "expected JSON inside <tool_call>"),
        ('<tool_call>["bash"]</tool_call>', 'expected {"name"'),
        ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "expected arguments to be an object, got list"),
    ],
)
def test_malformed_calls_explain_themselves(text: str, message: str) -> None:
    with pytest.raises(MalformedToolCall, match=message.replace("[", r"\[").replace("{", r"\{")):
        parse_hermes(text)
