"""Demonstrations of read_number episodes as the episode runner tokenizes them, for a warm-up.

The sequence is exactly what a successful episode stores: the chat-template prompt (mask 0), the
`bash` call (mask 1), the tool observation (mask 0), the `submit` call (mask 1). The caller passes
the runner's observation framing (`observation_text`), so the two cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from core.renderers import CHATML
from environments.read_number.kind import SYSTEM_PROMPT, TOOL_SCHEMAS
from environments.read_number.task import NewTask


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes tool call as the chat template renders one."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def demonstration(
    task: NewTask, *, tokenizer: Any, observation_text: Callable[..., str], command: str = "cat {path}",
    short: bool = False, guess: str | None = None,
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a correct two-turn episode of `task`, or, with `guess`, of a sloppy
    one-turn episode that submits `guess` without reading the file.

    `short` leaves out the system turn and the tool schemas (a few hundred tokens of fixed text):
    the same assistant turns in a context ~6x shorter, so many more fit in a warm-up's compute.
    """
    messages = [{"role": "user", "content": task.instruction}]
    if not short:
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    tools = None if short else list(TOOL_SCHEMAS.values())
    prompt = list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                return_dict=False))
    im_end = tokenizer.convert_tokens_to_ids(CHATML.end_of_turn[0])  # Hermes calls: a ChatML stream

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    if guess is not None:
        blind = [*encode(tool_call_text("submit", {"answer": guess})), im_end]
        return prompt + blind, [0] * len(prompt) + [1] * len(blind)
    read = [*encode(tool_call_text("bash", {"command": command.format(path=task.payload.path)})), im_end]
    seen = encode(observation_text(f"{task.payload.number}\n", completion_closed=True))
    submit = [*encode(tool_call_text("submit", {"answer": task.payload.number})), im_end]
    ids = prompt + read + seen + submit
    mask = [0] * len(prompt) + [1] * len(read) + [0] * len(seen) + [1] * len(submit)
    return ids, mask
