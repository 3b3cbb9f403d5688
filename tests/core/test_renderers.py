"""The turn frame of each chat-template family, against the family's real template on a local tokenizer:
multi-turn streams extend token-exactly and equal the template's rendering of the same conversation,
hostile observations never become control tokens, the family is detected from template text, and a
template that drops `tools` is caught."""

from __future__ import annotations

from typing import Any

import pytest

from core.renderers import (
    CHATML,
    LLAMA3,
    MISTRAL,
    PROBE_MESSAGES,
    QWEN,
    mistral_call_id,
    renderer_for,
    split_control_strings,
    template_renders_tools,
)
from environments.parsing import PARSERS
from tests.chat_families import FAMILIES, encoders, family_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
MESSAGES = [{"role": "system", "content": "You are a careful agent."},
            {"role": "user", "content": "Read /work/number.txt and submit the number."}]
COMMANDS = ["ls", "cat /work/number.txt", "echo done"]
OBSERVATIONS = ["number.txt\n", "42\n", 'done "quoted" \\ tab\t and ünïcode\n']
FAMILY_NAMES = sorted(FAMILIES)


def _render(name: str, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    return list(family_tokenizer(name).apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, date_string="26 Jul 2024", return_dict=False, **kwargs))


def _conversation(name: str, turns: int) -> list[dict[str, Any]]:
    """The same episode as OpenAI-style messages: each tool call answered by its observation."""
    messages = list(MESSAGES)
    for turn in range(turns):
        call_id = mistral_call_id(turn)
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": {"command": COMMANDS[turn]}}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": OBSERVATIONS[turn]})
    return messages


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_multi_turn_streams_extend_and_equal_the_template(name: str) -> None:
    family, (chat, plain) = FAMILIES[name], encoders(name)
    stream = _render(name, MESSAGES)
    for turn in range(len(COMMANDS)):
        previous = list(stream)
        completion = chat(family.call_text("bash", {"command": COMMANDS[turn]}, turn=turn))
        frame = family.renderer.frame(OBSERVATIONS[turn], completion_closed=True, turn=turn)
        stream += completion + chat(frame.before) + plain(frame.text) + chat(frame.after)
        assert stream[:len(previous)] == previous
        assert stream == _render(name, _conversation(name, turn + 1)), f"{name}: turn {turn} drifts from the template"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_a_completion_cut_by_max_tokens_is_closed_by_the_frame(name: str) -> None:
    family, (chat, _) = FAMILIES[name], encoders(name)
    cut = family.renderer.frame("x", completion_closed=False)
    closed = family.renderer.frame("x", completion_closed=True)
    assert cut.before == family.renderer.end_of_turn[0] + closed.before
    assert chat(family.renderer.end_of_turn[0]) == [family_tokenizer(name).convert_tokens_to_ids(family.eos)]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_family_writes_calls_its_parser_reads(name: str) -> None:
    family = FAMILIES[name]
    text = family.call_text("bash", {"command": "ls -la"}, turn=3)
    call = PARSERS[family.renderer.tool_parser](text)
    assert call is not None and (call.name, call.arguments) == ("bash", {"command": "ls -la"})


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_hostile_observations_never_become_control_tokens(name: str) -> None:
    family, (chat, plain) = FAMILIES[name], encoders(name)
    tokenizer = family_tokenizer(name)
    controls = {tokenizer.convert_tokens_to_ids(token) for token in family.specials}
    hostile = "".join(f"{control}assistant\n" for control in family.renderer.control_strings)
    frame = family.renderer.frame(hostile, completion_closed=True)
    assert not controls & set(plain(frame.text))
    assert tokenizer.decode(plain(frame.text)) == frame.text
    # the remote path (vLLM's /tokenize parses specials): cut inside every control string first
    remote = [token for segment in split_control_strings(frame.text, family.renderer.control_strings)
              for token in chat(segment)]
    assert not controls & set(remote)
    # the frame's own control tokens are all the stream gains
    ids = chat(frame.before) + plain(frame.text) + chat(frame.after)
    assert sum(token in controls for token in ids) == sum(token in controls for token in chat(frame.before + frame.after))


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_family_is_detected_from_its_template_and_from_a_rendering(name: str) -> None:
    family = FAMILIES[name]
    assert renderer_for(family.template) is family.renderer
    rendered = family_tokenizer(name).apply_chat_template(PROBE_MESSAGES, add_generation_prompt=True, tokenize=False)
    assert renderer_for(str(rendered)) is family.renderer


def test_an_unknown_family_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"expected one of the families qwen .*chatml .*llama3 .*mistral .*got a template"):
        renderer_for("{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>{% endfor %}")


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_real_templates_render_tools(name: str) -> None:
    tokenizer = family_tokenizer(name)
    assert template_renders_tools(lambda **kw: str(tokenizer.apply_chat_template(
        kw["messages"], tools=kw["tools"], tokenize=False, add_generation_prompt=True)))


def test_a_template_that_drops_tools_is_detected() -> None:
    tokenizer = family_tokenizer("chatml")
    plain_chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert not template_renders_tools(lambda **kw: str(tokenizer.apply_chat_template(
        kw["messages"], tools=kw["tools"], tokenize=False, add_generation_prompt=True, chat_template=plain_chatml)))


def test_each_family_speaks_its_own_format() -> None:
    assert (CHATML.tool_parser, LLAMA3.tool_parser, MISTRAL.tool_parser) == ("hermes", "llama3", "mistral")
    assert "<tool_call>" in CHATML.no_tool_call and '"parameters"' in LLAMA3.no_tool_call
    assert "[TOOL_CALLS]" in MISTRAL.no_tool_call
    assert LLAMA3.end_of_turn == ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")  # the first closes a cut turn
    assert CHATML.end_of_turn == QWEN.end_of_turn == ("<|im_end|>", "<|endoftext|>")


# Qwen2.5's own template, its message loop as published (tool results: a `user` turn of <tool_response> blocks).
QWEN_TEMPLATE = """{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system") or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""


def test_qwens_own_template_frames_a_tool_result_as_a_user_turn_and_is_told_from_chatml() -> None:
    """Qwen2.5 / Qwen3 keep their own template on import (it renders tools): its frame is theirs, not the
    `tool` turn of Crucible's ChatML template, and a rendering that shows a tool result tells the two apart."""
    import jinja2

    template = jinja2.Environment().from_string(QWEN_TEMPLATE)
    head = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"}]
    observation = "total 0\n-rw-r--r-- data.txt"
    before = template.render(messages=head, add_generation_prompt=False)
    after = template.render(messages=[*head, {"role": "tool", "content": observation}], add_generation_prompt=True)
    # the completion ended with <|im_end|>: the template's own "\n" follows, then the frame
    assert after == before.removesuffix("\n") + QWEN.frame(observation, completion_closed=True).joined()
    assert renderer_for(QWEN_TEMPLATE) is QWEN and renderer_for(after) is QWEN
    from trainer.chat_template import CHAT_TEMPLATE

    assert renderer_for(CHAT_TEMPLATE) is CHATML  # ours has no <tool_response>: a `tool` turn
