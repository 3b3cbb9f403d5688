"""The records an episode keeps in its JSON columns, declared once: written through these models, read back
through them.

    episode.failures = [*episode.failures, FailureRecord(reason="worker_lost", worker="w1", source="reconcile").stored()]
    losses = sum(1 for failure in FailureRecord.read_all(episode.failures) if failure.source == "reconcile")

`episodes.failures` holds FailureRecord entries (an infrastructure fault, a lost worker, a failed judging),
`episodes.verifier_layers` (and `regrade_results.verifier_layers`) LayerRecord entries, `turns.tool_call`
a ToolCallRecord; `reward_components` and `timings` are maps of names to numbers (RewardComponents,
Timings). The ORM columns stay JSON (dicts and lists, what SQL and the archive read); `stored()` is what is
written, and a writer that gives a wrong field or type fails there, not at a reader months later.
`read_all` raises pydantic's ValidationError on an entry that is not such a record (a reader that counts
them must not count a surprising entry as nothing); the API shapes what it shows with `api.services.
json_shapes`, which keeps such an entry visible instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def stored(self) -> dict[str, Any]:
        """The record as its JSON column holds it (absent fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def read_all(cls, value: Iterable[Any] | None) -> list[Self]:
        """A JSON column's list of records as models (None: none)."""
        return [cls.model_validate(item) for item in value or ()]


class FailureRecord(_Record):
    """One entry of `episodes.failures`: a fault the episode met, kept when it is retried or given up."""

    reason: str
    """A TerminationReason value (`sandbox_error`, `worker_lost`, `judge_error`, ...)."""
    at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    message: str | None = Field(default=None, max_length=1000)
    worker: str | None = None
    source: str | None = None
    """Who recorded it where that is not the episode's own worker: `reconcile` (a lost worker), `group_judge`."""
    attempt: int | None = None
    """The group judge's failed attempt it was (None: the record of the group's drop)."""
    status: str | None = None
    """The episode's status when its worker was found lost."""
    incarnation: str | None = None
    """The lost worker's incarnation."""


class LayerRecord(_Record):
    """One entry of `episodes.verifier_layers`: a verifier layer's result as stored with the episode."""

    name: str
    score: float
    passed: bool
    detail: str = Field(default="", max_length=4000)
    duration_s: float = 0.0
    record: dict[str, Any] | None = None
    """What the layer keeps beyond its detail (a judge: its prompt, output, parsed score and latency)."""


class ToolCallRecord(_Record):
    """`turns.tool_call`: the call the turn's completion made, as parsed."""

    name: str
    arguments: dict[str, Any]


class ProgramRecord(_Record):
    """`episodes.program`: how an agent program's episode went (environments/agent_program): None for
    Crucible's own loop."""

    exit_status: int | None
    """The program's own exit status; negative: killed by that signal (the platform stopped it: `stopped`)."""
    stopped: str | None = None
    """Why the platform stopped it: `max_calls`, `timeout`, `context` (a call past the context window); None:
    it exited by itself."""
    calls: int
    """Model calls answered through the gateway (each a turn)."""
    refused: int = 0
    """Requests the gateway answered with an error without sampling (unreadable, past the budget)."""
    segments: int
    """Token streams its calls made: a call whose prompt does not extend the previous call's prompt and
    completion starts a new one (the program rewrote its context)."""
    output: str = Field(default="", max_length=65536)
    """The last of what it printed."""


RewardComponents = TypeAdapter(dict[str, float])
"""`episodes.reward_components`: each verifier layer's score by its name."""
Timings = TypeAdapter(dict[str, float])
"""`episodes.timings`: seconds by phase (sandbox, policy, tools, verify, judge)."""

LAYER_KEYS = tuple(LayerRecord.model_fields)
FAILURE_KEYS = tuple(FailureRecord.model_fields)
