"""Groups of rollouts, episodes and their turns: the trajectories the trainer learns from."""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import ARRAY, REAL, TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from core.models.base import Base, created_at_column
from core.termination import GroupStatus, TerminationReason

_REASONS = ", ".join(f"'{reason.value}'" for reason in TerminationReason)


class EpisodeGroup(Base):
    """G rollouts of one task under one policy version: the unit GRPO normalises over."""

    __tablename__ = "episode_groups"
    __table_args__ = (
        UniqueConstraint("run_id", "group_index"),
        Index(None, "run_id", "status"),
        CheckConstraint("size >= 1", name="size_positive"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    group_index: Mapped[int] = mapped_column(Integer)
    """Position of the group in the run's dispatch order."""
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"))
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"))
    size: Mapped[int] = mapped_column(Integer)
    policy_version: Mapped[int] = mapped_column(Integer)
    """The run's policy version when the group was dispatched."""
    status: Mapped[str] = mapped_column(String(16), default=GroupStatus.RUNNING)
    """core.termination.GroupStatus: running → complete (all samples ended) → consumed or dropped."""
    consumed_step: Mapped[int | None] = mapped_column(Integer)
    drop_reason: Mapped[str | None] = mapped_column(String(32))
    """core.termination.DropReason, when the trainer dropped it (None before migration 0011)."""
    dropped_step: Mapped[int | None] = mapped_column(Integer)
    """The trainer's step when it dropped the group: the version it was at (0 before the first update)."""
    created_at: Mapped[datetime] = created_at_column()


class Episode(Base):
    """One rollout. (run, group, sample index) is its idempotency key."""

    __tablename__ = "episodes"
    __table_args__ = (
        UniqueConstraint("run_id", "group_id", "sample_index", name="uq_episodes_idempotency_key"),
        CheckConstraint(f"termination_reason IS NULL OR termination_reason IN ({_REASONS})", name="reason_known"),
        Index(None, "run_id", "status"),
        Index(None, "run_id", "termination_reason"),
        Index(None, "run_id", "reward"),
        Index(None, "run_id", "policy_version"),
        Index(None, "run_id", "environment_id", "id"),
        Index(None, "run_id", "id"),
        Index(None, "group_id"),
        Index("ix_episodes_reward_components", "reward_components", postgresql_using="gin"),
        Index("ix_episodes_flags", "flags", postgresql_using="gin"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    group_id: Mapped[int] = mapped_column(ForeignKey("episode_groups.id", ondelete="CASCADE"))
    sample_index: Mapped[int] = mapped_column(Integer)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"))
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Infrastructure retries so far; the faults are kept in `failures`."""
    failures: Mapped[list[Any]] = mapped_column(default=list)
    termination_reason: Mapped[str | None] = mapped_column(String(32))
    reward: Mapped[float | None] = mapped_column(Float)
    reward_components: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Every verifier layer's score by name, e.g. {"format": 1.0, "public_tests": 0.5}."""
    policy_version: Mapped[int | None] = mapped_column(Integer)
    """The oldest weight version any of its turns may have been sampled with (the lowest turn start
    version): what the dashboard shows. The trainer measures staleness per token (turns.version_runs)."""
    policy_version_last: Mapped[int | None] = mapped_column(Integer)
    """The newest weight version any of its turns may have been sampled with (highest end version)."""
    advantage: Mapped[float | None] = mapped_column(Float)
    """The advantage the trainer used for this episode; None until a step trained on it."""
    trained_score: Mapped[float | None] = mapped_column(Float)
    """The reward after the trainer's shaping and normalisation, which the advantage came from."""
    num_turns: Mapped[int] = mapped_column(Integer, default=0)
    num_tokens: Mapped[int] = mapped_column(Integer, default=0)
    timings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Seconds by stage: generation, sandbox, verify, total."""
    prefix_breaks: Mapped[int] = mapped_column(Integer, server_default="0")
    """Turns whose prompt, as the policy server sampled from it, was not the previous turn's prompt and
    completion extended (task_workers/episode/loop.py): what was trained on is not what was sampled."""
    unparsed_tool_calls: Mapped[int] = mapped_column(Integer, server_default="0")
    """Turns whose tool call was begun but could not be read by the episode's parser."""
    turns_without_tool_call: Mapped[int] = mapped_column(Integer, server_default="0")
    """Turns whose completion held no tool call (many: a parser of the wrong chat-template family)."""
    program: Mapped[dict[str, Any] | None]
    """An agent program's episode (environments/agent_program): its exit status, calls and segments
    (core.schemas.episode.ProgramRecord); None for Crucible's own loop."""
    verifier_layers: Mapped[list[Any]] = mapped_column(default=list, server_default="[]")
    """Each verifier layer's name, score, pass flag, detail and duration, in order."""
    final_diff: Mapped[str | None] = mapped_column(Text, deferred=True)
    """What the agent changed (code tasks), as a binary-safe diff: exactly what was graded."""
    flags: Mapped[list[str]] = mapped_column(ARRAY(String(32)), default=list, server_default="{}")
    """What the hack monitors saw: core.flags.EpisodeFlag values."""
    sandbox_id: Mapped[str | None] = mapped_column(String(64))
    worker: Mapped[str | None] = mapped_column(String(128))
    worker_incarnation: Mapped[str | None] = mapped_column(String(64))
    """The worker process that leased it (task_workers.heartbeat.incarnation()): when that process is
    gone (its name now beats under another incarnation, or its heartbeat stopped) the episode is requeued."""
    deadline_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_at_column()


class Turn(Base):
    """One step of an episode. Its tokens are the context added since the previous turn
    (environment text, loss mask 0) followed by the completion sampled by the policy (mask 1);
    concatenating an episode's turns of one segment gives the exact sequence the policy saw.

    Partitioned by run (RANGE on run_id, one run per partition, `turns_run_<id>`, created by a trigger
    when the run row is inserted; turns stored before migration 0008 live in `turns_legacy`, the
    partition of every older run id). Every query names the run, so it reads one partition; an
    archived run's partition is empty and its turns are read from Parquet (core.archive). No foreign
    keys: attaching a partition would clone them, locking runs and episodes against every writer until
    the run's transaction commits (and deadlocking two launches at once).
    """

    __tablename__ = "turns"
    __table_args__ = (
        Index("ix_turns_search", "search", postgresql_using="gin"),
        CheckConstraint(
            "cardinality(token_ids) = cardinality(logprobs) AND cardinality(token_ids) = cardinality(loss_mask)",
            name="token_arrays_aligned",
        ),
        {"postgresql_partition_by": "RANGE (run_id)"},
    )

    run_id: Mapped[int] = mapped_column(primary_key=True)
    """The run (no foreign key: its partition is the constraint, a turn of a run without one is refused)."""
    episode_id: Mapped[int] = mapped_column(primary_key=True)
    """The episode (no foreign key: the store writes turns in their episode's transaction; see Turn)."""
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_ids: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    logprobs: Mapped[list[float]] = mapped_column(ARRAY(REAL))
    """Behaviour logprobs from vLLM for sampled tokens; 0 where the mask is 0."""
    loss_mask: Mapped[list[int]] = mapped_column(ARRAY(SmallInteger))
    prompt_length: Mapped[int] = mapped_column(Integer)
    """How many leading tokens are context (environment text), not sampled."""
    completion_text: Mapped[str] = mapped_column(Text, default="")
    tool_call: Mapped[dict[str, Any] | None]
    observation: Mapped[str | None] = mapped_column(Text)
    """The tool output as the policy saw it (capped)."""
    tool_output_full: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    tool_status: Mapped[str | None] = mapped_column(String(32))
    duration_s: Mapped[float | None] = mapped_column(Float)
    generation_s: Mapped[float | None] = mapped_column(Float)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    truncated_bytes: Mapped[int] = mapped_column(Integer, default=0)
    segment: Mapped[int] = mapped_column(Integer, server_default="0")
    """Which token stream of its episode it continues: 0 for Crucible's own loop; an agent program's call
    that did not extend the previous call's tokens starts the next (trained as a sequence of its own)."""
    weight_version: Mapped[int | None] = mapped_column(Integer)
    """The oldest weight version that sampled a token of it: vLLM's per-token label where the server
    reports one, else the version when the request was sent. None: the server reported no version."""
    weight_version_end: Mapped[int | None] = mapped_column(Integer)
    """The newest weight version that sampled a token of it (else the version once it returned)."""
    version_runs: Mapped[list[int] | None] = mapped_column(ARRAY(Integer))
    """The version of every sampled token, run-length encoded over the completion: [v₀, n₀, v₁, n₁, …],
    Σn = the completion's length (core/token_versions.py). From vLLM's per-token spans; where the server
    reports none, every token carries the version when the request was sent. None: stored before
    migration 0011, or no version reported."""
    replica: Mapped[str | None] = mapped_column(Text)
    """The policy replica (its URL, without credentials) that sampled it; None: a lone policy client."""
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    search: Mapped[str] = mapped_column(
        TSVECTOR,
        Computed(
            "to_tsvector('simple', left(coalesce(completion_text, '') || ' ' || coalesce(observation, ''), 200000))",
            persisted=True,
        ),
        deferred=True,
    )
    created_at: Mapped[datetime] = created_at_column()
