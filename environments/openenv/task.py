"""OpenEnv tasks: how an episode's `reset` is called.

    {"seed": 3}                                  # reset(seed=3): the environment's instance 3
    {"seed": 3, "options": {"level": 2}}         # reset(seed=3, level=2)

Every sample of a group meets the same instance: the seed is the task's, not the sample's (as a MiniWoB++
page's seed is). An environment that draws its instance without the seed (its own random choice) gives
each sample its own; the seed is still sent.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_OPTIONS_BYTES = 16 * 1024
RESERVED = ("seed", "episode_id")


class OpenEnvTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    options: dict[str, Any] = Field(default_factory=dict, max_length=64)
    """Further keyword arguments of the environment's `reset` (JSON values)."""

    @field_validator("options")
    @classmethod
    def _options_are_small_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = [key for key in value if key in RESERVED]
        if reserved:
            raise ValueError(f"expected no {', '.join(reserved)} among the options (the task's seed and the "
                             f"episode give them), got {', '.join(reserved)}")
        try:
            size = len(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise ValueError(f"expected JSON values, got {error}") from None
        if size > MAX_OPTIONS_BYTES:
            raise ValueError(f"expected at most {MAX_OPTIONS_BYTES} bytes of options, got {size}")
        return value
