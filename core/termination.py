"""The closed vocabulary of episode termination reasons (see ARCHITECTURE.md).

Infrastructure faults are retried and never trained on as if the agent failed; every other reason is
the agent's own outcome and is trained on.
"""

from enum import StrEnum


class TerminationReason(StrEnum):
    SUBMITTED = "submitted"
    MAX_TURNS = "max_turns"
    CONTEXT_EXHAUSTED = "context_exhausted"
    EPISODE_TIMEOUT = "episode_timeout"
    FORMAT_ERROR = "format_error"
    TOOL_ERROR_LIMIT = "tool_error_limit"
    POLICY_ERROR = "policy_error"
    SANDBOX_ERROR = "sandbox_error"
    WORKER_LOST = "worker_lost"
    CANCELLED = "cancelled"

    @property
    def is_infrastructure_fault(self) -> bool:
        return self in INFRASTRUCTURE_FAULTS

    @property
    def is_trainable(self) -> bool:
        """The agent's own outcome: the trainer learns from it."""
        return self not in INFRASTRUCTURE_FAULTS and self is not TerminationReason.CANCELLED


INFRASTRUCTURE_FAULTS = frozenset(
    {TerminationReason.SANDBOX_ERROR, TerminationReason.WORKER_LOST, TerminationReason.POLICY_ERROR}
)


class EpisodeStatus(StrEnum):
    """Where an episode is in its life. Only `completed` episodes are trained on."""

    PENDING = "pending"  # dispatched, not picked up yet
    RUNNING = "running"
    COMPLETED = "completed"  # ended with an agent outcome (any trainable reason)
    FAILED = "failed"  # ended by an infrastructure fault; retried under a new attempt
    CANCELLED = "cancelled"


class GroupStatus(StrEnum):
    """Where a GRPO group is in its life: the one spelling controller, workers, trainer and API share."""

    RUNNING = "running"  # dispatched, some episode still pending or running
    COMPLETE = "complete"  # every episode ended; waiting for the trainer
    CONSUMED = "consumed"  # trained on
    DROPPED = "dropped"  # the trainer discarded it (zero variance, too stale, non-finite loss)


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"
