"""Tool calls in the Llama 3 and Mistral formats (core/renderers.py names each family's parser): well
formed, absent, and malformed with a message that names what was expected and what was given."""

from __future__ import annotations

import pytest

from environments.parsing import AUTO, PARSERS, MalformedToolCall, parse_llama3, parse_mistral
from environments.spec import EnvironmentSpec


@pytest.mark.parametrize("text", [
    '{"name": "bash", "parameters": {"command": "ls"}}<|eot_id|>',
    '<|python_tag|>{"name": "bash", "parameters": {"command": "ls"}}<|eom_id|>',
    '  {"name": "bash", "arguments": {"command": "ls"}}',
    '{"name": "bash", "parameters": "{\\"command\\": \\"ls\\"}"}; {"name": "submit", "parameters": {}}',
])
def test_llama3_calls(text: str) -> None:
    call = parse_llama3(text)
    assert call is not None and (call.name, call.arguments) == ("bash", {"command": "ls"})


def test_llama3_prose_holds_no_call() -> None:
    assert parse_llama3("The answer is 42.<|eot_id|>") is None


@pytest.mark.parametrize(("text", "message"), [
    ('{"name": "bash", "parameters": {"command": "ls"}', 'expected a JSON object {"name": "...", "parameters"'),
    ('{"tool": "bash"}', 'expected {"name": "...", "parameters": {...}}, got {"tool": "bash"}'),
    ('{"name": "bash", "parameters": [1]}', "expected parameters or arguments to be an object, got list"),
    ('<|python_tag|>brave_search.call(query="x")', "expected {\"name\": \"...\", \"parameters\": {...}} after "
                                                  "<|python_tag|>, got 'brave_search"),
])
def test_llama3_malformed_calls_explain_themselves(text: str, message: str) -> None:
    with pytest.raises(MalformedToolCall) as raised:
        parse_llama3(text)
    assert message in str(raised.value)


@pytest.mark.parametrize("text", [
    '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}, "id": "call00000"}]</s>',
    'Let me look. [TOOL_CALLS] {"name": "bash", "arguments": {"command": "ls"}}',
    '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}}, {"name": "submit", "arguments": {}}]',
])
def test_mistral_calls(text: str) -> None:
    call = parse_mistral(text)
    assert call is not None and (call.name, call.arguments) == ("bash", {"command": "ls"})


def test_mistral_keeps_the_models_call_id_and_prose_holds_none() -> None:
    call = parse_mistral('[TOOL_CALLS][{"name": "bash", "arguments": {}, "id": "abcdefghi"}]')
    assert call is not None and call.id == "abcdefghi"
    assert parse_mistral("No tools needed.</s>") is None


@pytest.mark.parametrize(("text", "message"), [
    ("[TOOL_CALLS]bash{}", 'expected [TOOL_CALLS][{"name": "...", "arguments": {...}}], got a parse error'),
    ("[TOOL_CALLS][]", "got an empty list"),
    ('[TOOL_CALLS][{"arguments": {}}]', 'got {"arguments": {}}'),
    ('[TOOL_CALLS][{"name": "bash", "arguments": "not json"}]', "expected arguments to be a JSON object, got the string"),
])
def test_mistral_malformed_calls_explain_themselves(text: str, message: str) -> None:
    with pytest.raises(MalformedToolCall) as raised:
        parse_mistral(text)
    assert message in str(raised.value)


def test_every_family_parser_is_registered() -> None:
    assert {"hermes", "llama3", "mistral", "browsergym"} <= set(PARSERS)


def test_a_spec_defaults_to_the_models_parser_and_refuses_unknown_ones() -> None:
    base = {"name": "parsers", "kind": "read_number", "image": "crucible-read-number:latest"}
    assert EnvironmentSpec.model_validate(base).tool_parser == AUTO
    assert EnvironmentSpec.model_validate({**base, "tool_parser": "llama3"}).tool_parser == "llama3"
    with pytest.raises(ValueError, match="tool_parser: expected auto or one of browsergym, hermes, llama3, mistral"):
        EnvironmentSpec.model_validate({**base, "tool_parser": "pythonic"})
