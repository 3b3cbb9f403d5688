"""How environment text joins the token stream between two policy turns (ChatML family).

The first prompt is rendered by the server's chat template (`/tokenize` with messages and tools).
After that, each observation is appended as the tokens of a `tool` message plus the next
generation prompt — tokenized on its own, so the earlier tokens never change.
"""

from __future__ import annotations

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CONTROL_STRINGS = (IM_START, IM_END, "<|endoftext|>")
"""The ChatML family's control tokens: environment text must never be tokenized into them."""


def observation_frame(*, completion_closed: bool) -> tuple[str, str]:
    """The chat structure around an observation: (before, after). The observation itself goes between,
    tokenized as plain text; `before` ends with the role line, so `tool\n` + the text is one segment
    exactly as the chat template would tokenize it.

    `completion_closed`: the sampled tokens already end with <|im_end|> (a normal stop); a
    completion cut by `max_tokens` is closed here instead.
    """
    close = "" if completion_closed else IM_END
    return f"{close}\n{IM_START}", f"{IM_END}\n{IM_START}assistant\n"


def observation_text(observation: str, *, completion_closed: bool) -> str:
    """The text between the end of a completion and the start of the next one (for display)."""
    before, after = observation_frame(completion_closed=completion_closed)
    return f"{before}tool\n{observation}{after}"
