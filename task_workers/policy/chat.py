"""The ChatML turn frame as text, for the streams that are ChatML by construction: the warm-up
demonstrations of our tiny models (recipes/demo.py, environments/read_number/demos.py).

Every other stream takes its frame from the served model's family (core/renderers.py; the agent loop
asks its policy client for it); this is that module's ChatML family, joined into one string.
"""

from __future__ import annotations

from core.renderers import CHATML

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def observation_text(observation: str, *, completion_closed: bool) -> str:
    """The text between the end of a completion and the start of the next one (for display)."""
    return CHATML.frame(observation, completion_closed=completion_closed).joined()
