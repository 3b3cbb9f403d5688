"""An episode as one text, the way learned rewards read it: a reward model is trained on this
rendering (`crucible rm train --run`, trainer/preference_mining.py) and scores it
(the `reward_model` layer, environments/reward_model_layer.py) — one rendering, so the two agree."""

from __future__ import annotations

OBSERVATION_MARK = "[observation]"


def render_turns(turns: list[tuple[str, str | None]]) -> str:
    """An episode's (completion text, observation) per turn as one response text."""
    parts: list[str] = []
    for completion, observation in turns:
        parts.append(completion)
        if observation:
            parts.append(f"{OBSERVATION_MARK}\n{observation}")
    return "\n".join(parts)
