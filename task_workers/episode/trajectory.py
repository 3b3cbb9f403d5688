"""What one episode produced, before it is stored."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.termination import TerminationReason


@dataclass
class TurnRecord:
    index: int
    token_ids: list[int]  # (P + C,) environment tokens then sampled tokens
    logprobs: list[float]  # (P + C,) 0 for environment tokens
    loss_mask: list[int]  # (P + C,) 0 environment, 1 sampled
    prompt_length: int  # P
    completion_text: str
    finish_reason: str | None
    generation_s: float
    weight_version: int | None
    """The oldest weight version that sampled a token of it (None: not reported)."""
    weight_version_end: int | None
    """The newest weight version that sampled a token of it."""
    version_runs: list[int] | None = None
    """The version of every sampled token, run-length encoded (core/token_versions.py)."""
    tool_call: dict[str, Any] | None = None
    observation: str | None = None
    tool_output_full: str | None = None
    exit_code: int | None = None
    tool_status: str | None = None
    duration_s: float | None = None
    truncated: bool = False
    truncated_bytes: int = 0
    replica: str | None = None
    """The policy replica that sampled it (task_workers/policy/pool.py); None from a lone client."""
    segment: int = 0
    """Which token stream it continues: an agent program's call whose prompt does not extend the previous
    call's prompt and completion starts a new segment (task_workers/episode/gateway.py), trained as a
    sequence of its own; Crucible's own loop has one."""


@dataclass(frozen=True)
class ArtifactRecord:
    """A file an observation produced (environments.base.Artifact), tied to its turn; turn_index None
    is the opening observation, before the first turn."""

    turn_index: int | None
    name: str
    media_type: str
    data: bytes


@dataclass
class Trajectory:
    turns: list[TurnRecord] = field(default_factory=list)
    termination: TerminationReason | None = None
    submitted: bool = False
    artifacts: list[ArtifactRecord] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=lambda: {"generation": 0.0, "sandbox": 0.0})
    prefix_breaks: int = 0
    """Turns whose prompt was not the previous turn's prompt and completion extended (loop.py)."""
    unparsed_tool_calls: int = 0
    """Turns whose tool call was begun but could not be read (MalformedToolCall)."""
    turns_without_tool_call: int = 0
    """Turns whose completion held no tool call (an agent program's: no match of its action syntax)."""
    program: dict[str, Any] | None = None
    """An agent program's record (core.schemas.episode.ProgramRecord): its exit status, calls, segments."""

    @property
    def num_tokens(self) -> int:
        return sum(len(turn.token_ids) for turn in self.turns)

    @property
    def behaviour_version(self) -> int | None:
        """The oldest version any turn may have been sampled with (the trainer measures staleness per
        token, from each turn's version_runs)."""
        starts = [turn.weight_version for turn in self.turns if turn.weight_version is not None]
        return min(starts) if starts else None

    @property
    def newest_version(self) -> int | None:
        ends = [turn.weight_version_end for turn in self.turns if turn.weight_version_end is not None]
        return max(ends) if ends else None
