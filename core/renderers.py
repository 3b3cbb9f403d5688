"""The turn frame of each chat-template family: how environment text joins the token stream between
two policy turns, how the family writes a tool call, and what ends a turn.

The first prompt is rendered by the served model's own chat template (`/tokenize` with messages and
tools). After that the stream is never re-rendered: each observation is appended as a `Frame` —
control text around plain text — tokenized on its own, so the earlier tokens never change. Every
frame here is what the family's real template renders for a tool result followed by the next
generation prompt, cut at its control tokens (a tokenizer splits on those first, so tokenizing the
pieces apart gives the template's ids):

    family   observation turn                                                    tool calls (parser)
    chatml   <|im_start|>tool\\n{text}<|im_end|>\\n<|im_start|>assistant\\n        <tool_call>{...}</tool_call> (hermes)
    llama3   <|start_header_id|>ipython<|end_header_id|>\\n\\n"{json}"<|eot_id|>…  {"name", "parameters"} (llama3)
    mistral  [TOOL_RESULTS]{"content": {text}, "call_id": "…"}[/TOOL_RESULTS]     [TOOL_CALLS][{...}] (mistral)

`renderer_for` picks the family from a template's text — its source or a rendering of it, so a
worker can detect a remote server's family from a probe conversation rendered by `/tokenize`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROBE_MESSAGES: list[dict[str, Any]] = [{"role": "system", "content": "Probe."}, {"role": "user", "content": "Probe."}]
PROBE_EXCHANGE: list[dict[str, Any]] = [*PROBE_MESSAGES, {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call00000", "type": "function", "function": {"name": "probe", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call00000", "content": "Probe."}]
"""The probe with a tool call and its result: a family that differs from another only in how a tool
result is framed (Qwen's `<tool_response>` against ChatML's `tool` turn) shows it only here."""
"""A conversation every family's template renders (Mistral's wants user/assistant alternation)."""
PROBE_TOOL_NAME = "crucible_probe_tool_q7x2"
"""A name no template writes by itself: seen in a rendering, the template rendered `tools`."""


@dataclass(frozen=True)
class Frame:
    """The chat structure around one observation. `before` and `after` are tokenized with their
    control strings parsed as control tokens; `text` (the observation in the family's envelope) as
    plain text, so nothing a tool prints can close the turn or open another."""

    before: str
    text: str
    after: str

    def joined(self) -> str:
        """The frame as one string (for display and for comparing with a template's rendering)."""
        return f"{self.before}{self.text}{self.after}"


@dataclass(frozen=True)
class Renderer:
    """One chat-template family. Subclasses write `frame`; the rest is data."""

    family: str
    tool_parser: str
    """The name of its tool-call parser in environments.parsing.PARSERS."""
    markers: tuple[str, ...]
    """Strings every template of the family (and every rendering of one) contains."""
    control_strings: tuple[str, ...]
    """The family's control tokens: environment text must never be tokenized into them."""
    end_of_turn: tuple[str, ...]
    """The tokens that end an assistant turn; the first closes a turn cut by `max_tokens`."""
    call_format: str
    """How a call is written in the family's format, for instructions and feedback."""

    @property
    def no_tool_call(self) -> str:
        """The feedback for a completion without a tool call, in the family's own call format."""
        return f"No tool call found. Call exactly one tool as {self.call_format}."

    def frame(self, observation: str, *, completion_closed: bool, turn: int = 0) -> Frame:
        """The frame around `observation` after turn `turn` (0-based). `completion_closed`: the sampled
        tokens already end with an end-of-turn token (a normal stop); a completion cut by
        `max_tokens` is closed here instead."""
        raise NotImplementedError

    def _close(self, completion_closed: bool) -> str:
        return "" if completion_closed else self.end_of_turn[0]


@dataclass(frozen=True)
class ChatML(Renderer):
    """Qwen, SmolLM and our tiny models: a tool result is its own `tool` turn (trainer/chat_template.py)."""

    def frame(self, observation: str, *, completion_closed: bool, turn: int = 0) -> Frame:
        # `tool\n` goes with the text: between two control tokens it is one segment in the template
        return Frame(f"{self._close(completion_closed)}\n<|im_start|>", f"tool\n{observation}",
                     "<|im_end|>\n<|im_start|>assistant\n")


@dataclass(frozen=True)
class Qwen(Renderer):
    """Qwen2.5 / Qwen3's own templates: ChatML, but a tool result is a `user` turn wrapped in
    `<tool_response>` tags (Crucible's own ChatML template gives it a `tool` turn instead)."""

    def frame(self, observation: str, *, completion_closed: bool, turn: int = 0) -> Frame:
        return Frame(f"{self._close(completion_closed)}\n<|im_start|>", f"user\n<tool_response>\n{observation}\n"
                     "</tool_response>", "<|im_end|>\n<|im_start|>assistant\n")


@dataclass(frozen=True)
class Llama3(Renderer):
    """Llama 3.1 / 3.2 Instruct: a tool result is an `ipython` turn. Their template writes a string
    result through `tojson` (a string is a Jinja iterable), so the observation is a JSON string."""

    def frame(self, observation: str, *, completion_closed: bool, turn: int = 0) -> Frame:
        return Frame(f"{self._close(completion_closed)}<|start_header_id|>ipython<|end_header_id|>",
                     "\n\n" + json.dumps(observation, ensure_ascii=False),
                     "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


@dataclass(frozen=True)
class Mistral(Renderer):
    """Mistral's Tekken templates (Nemo, Small, Ministral): a tool result is a `[TOOL_RESULTS]` block
    that names the call by a 9-character id; the assistant continues after it with no header. The
    model does not write ids reliably, so (as vLLM's Mistral parser does) the id is ours: one per turn."""

    def frame(self, observation: str, *, completion_closed: bool, turn: int = 0) -> Frame:
        return Frame(f"{self._close(completion_closed)}[TOOL_RESULTS]",
                     f'{{"content": {observation}, "call_id": "{mistral_call_id(turn)}"}}', "[/TOOL_RESULTS]")


def mistral_call_id(turn: int) -> str:
    """The 9-character alphanumeric call id of turn `turn` in a Mistral stream."""
    return f"call{turn % 100000:05d}"


HERMES_CALL = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
"""How a Hermes-style call is written: environments' system prompts say it in this one spelling, and the
loop replaces it with the served family's own (`instructions`)."""
CHATML_CONTROL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
CHATML = ChatML(
    family="chatml", tool_parser="hermes", markers=("<|im_start|>",), control_strings=CHATML_CONTROL,
    end_of_turn=("<|im_end|>", "<|endoftext|>"), call_format=HERMES_CALL,
)
QWEN = Qwen(
    family="qwen", tool_parser="hermes", markers=("<|im_start|>", "<tool_response>"), control_strings=CHATML_CONTROL,
    end_of_turn=("<|im_end|>", "<|endoftext|>"), call_format=HERMES_CALL,
)
LLAMA3 = Llama3(
    family="llama3", tool_parser="llama3", markers=("<|start_header_id|>", "<|end_header_id|>"),
    control_strings=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"),
    end_of_turn=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    call_format='a JSON object: {"name": ..., "parameters": {...}}',
)
MISTRAL = Mistral(
    family="mistral", tool_parser="mistral", markers=("[INST]",),
    control_strings=("<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                     "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
    end_of_turn=("</s>",),
    call_format='[TOOL_CALLS][{"name": ..., "arguments": {...}}]',
)
RENDERERS: dict[str, Renderer] = {renderer.family: renderer for renderer in (QWEN, CHATML, LLAMA3, MISTRAL)}
"""In detection order: the more specific first (Qwen's template is ChatML with `<tool_response>`)."""


def renderer_for(chat_template: str) -> Renderer:
    """The family of a chat template, from its source or from a rendering of it."""
    for renderer in RENDERERS.values():
        if all(marker in chat_template for marker in renderer.markers):
            return renderer
    expected = "; ".join(f"{r.family} ({' and '.join(r.markers)})" for r in RENDERERS.values())
    raise ValueError(f"chat template: expected one of the families {expected}, got a template with none of "
                     f"their markers: {chat_template[:160]!r}")


def template_renders_tools(render: Callable[..., str]) -> bool:
    """Whether a chat template writes the `tools` it is given into the prompt. `render(messages=…,
    tools=…)` renders a conversation with a generation prompt, as text (e.g. `lambda **kw:
    tokenizer.apply_chat_template(kw["messages"], tools=kw["tools"], tokenize=False,
    add_generation_prompt=True)`); a template that drops `tools` leaves a model never told its tools."""
    tool = {"type": "function", "function": {
        "name": PROBE_TOOL_NAME, "description": "A probe.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}
    return PROBE_TOOL_NAME in render(messages=[dict(message) for message in PROBE_MESSAGES], tools=[tool])


def split_control_strings(text: str, control_strings: tuple[str, ...]) -> list[str]:
    """`text` cut inside every control string (`<|im_end|>` → `<|im_` | `end|>`), so that segments
    tokenized apart can never form a control token; the segments join back to `text`."""
    segments, start, position = [], 0, 0
    while position < len(text):
        hits = [(at, control) for control in control_strings if (at := text.find(control, position)) >= 0]
        if not hits:
            break
        at, control = min(hits)
        cut = at + len(control) // 2
        segments.append(text[start:cut])
        start = position = cut
    segments.append(text[start:])
    return segments
