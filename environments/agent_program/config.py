"""The `agent_program` section of an agent_program environment's spec: which program plays, with what budget.

    agent_program:
      command: [mini, -c, mini_textbased.yaml, -m, openai/policy, --yolo, --exit-immediately, -t, "{instruction}"]
      env: {MSWEA_COST_TRACKING: ignore_errors}
      max_calls: 30          # model calls; the next one is refused and the program stopped
      timeout_s: 600         # the program's own time (waits on the model are the platform's, not counted)
      action_regex: "```mswea_bash_command\\s*\\n(.*?)\\n```"   # optional: a call whose reply has no match
                                                           # counts as a turn without an action
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

INSTRUCTION = "{instruction}"
"""In `command`, replaced by the task's instruction (inside one argument: no shell ever reads it)."""
RESERVED_ENV = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "PATH", "HOME", "LD_PRELOAD",
                "LD_LIBRARY_PATH", "PYTHONPATH")
"""Set by the platform (the gateway's address and a key it ignores) or the sandbox's own."""


class ProgramConfig(BaseModel):
    """The `agent_program` section: the program's argv, its environment and its budget."""

    model_config = ConfigDict(extra="forbid")

    command: list[Annotated[str, Field(max_length=4096)]] = Field(min_length=1, max_length=64)
    """The program's argv, run as the agent in the task's repository (/workspace); `{instruction}` in an
    argument is the task's instruction. argv[0] is found on the image's PATH."""
    env: dict[Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Z_][A-Z0-9_]*$")],
              Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict, max_length=32)
    """The program's own settings; not the gateway's address nor the loader's (RESERVED_ENV)."""
    max_calls: int = Field(default=30, ge=1, le=1000)
    """Model calls the program may make, a request the gateway refuses unread counting as one; past them the
    next is answered 429 and the program stopped (max_turns)."""
    timeout_s: float = Field(default=600.0, gt=0, le=86400)
    """The program's own time: wall-clock time less its waits on the gateway (episode_timeout past it)."""
    max_request_bytes: int = Field(default=4 << 20, ge=4096, le=16 << 20)
    """One model call's request; a larger one is answered 400 unread."""
    action_regex: str | None = Field(default=None, max_length=1024)
    """The program's own action syntax: a call whose reply does not match it counts as a turn without an
    action (episodes.turns_without_tool_call). None: not counted."""

    @field_validator("env")
    @classmethod
    def _not_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(name for name in value if name in RESERVED_ENV)
        if reserved:
            raise ValueError(f"expected the program's own settings, got {', '.join(reserved)} (the platform's)")
        return value

    @field_validator("action_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as error:
                raise ValueError(f"expected a regular expression, got {value!r}: {error}") from None
        return value

    def argv(self, instruction: str) -> list[str]:
        return [part.replace(INSTRUCTION, instruction) for part in self.command]
