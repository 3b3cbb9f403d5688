"""How environment text joins the token stream between two policy turns (ChatML family).

The first prompt is rendered by the server's chat template (`/tokenize` with messages and tools).
After that, each observation is appended as the tokens of a `tool` message plus the next
generation prompt — tokenized on its own, so the earlier tokens never change.
"""

from __future__ import annotations

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def observation_text(observation: str, *, completion_closed: bool) -> str:
    """The text between the end of a completion and the start of the next one.

    `completion_closed`: the sampled tokens already end with <|im_end|> (a normal stop); a
    completion cut by `max_tokens` is closed here instead.
    """
    close = "" if completion_closed else IM_END
    return f"{close}\n{IM_START}tool\n{observation}{IM_END}\n{IM_START}assistant\n"
