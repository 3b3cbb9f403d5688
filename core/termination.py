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
    PROGRAM_EXITED = "program_exited"
    """An agent program (environments/agent_program) exited by itself, whatever its exit status."""
    POLICY_ERROR = "policy_error"
    SANDBOX_ERROR = "sandbox_error"
    JUDGE_ERROR = "judge_error"
    """A learned layer's server (judge, reward model) never answered: the episode was played and is
    kept, unscored (not re-run: a new sample would not bring the judge back)."""
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
    {TerminationReason.SANDBOX_ERROR, TerminationReason.WORKER_LOST, TerminationReason.POLICY_ERROR,
     TerminationReason.JUDGE_ERROR}
)


class EpisodeStatus(StrEnum):
    """Where an episode is in its life. Only `completed` episodes are trained on."""

    PENDING = "pending"  # dispatched, not picked up yet
    RUNNING = "running"
    SCORING = "scoring"
    """Played and stored with its turns and the layers that ran; a learned layer's server (judge, reward
    model) has not answered yet. Judged again from the store when the reconciler resends it, never
    re-played; failed with `judge_error` past the run's judge_patience_s."""
    COMPLETED = "completed"  # ended with an agent outcome (any trainable reason)
    FAILED = "failed"  # ended by an infrastructure fault; retried under a new attempt
    CANCELLED = "cancelled"


IN_PLAY = (EpisodeStatus.PENDING, EpisodeStatus.RUNNING)
"""Not played yet: a worker may (still) play it."""
OUTSTANDING = (*IN_PLAY, EpisodeStatus.SCORING)
"""Not ended: its group is not finished (never complete, never trained on) and its run not done."""
ENDED = (EpisodeStatus.COMPLETED, EpisodeStatus.FAILED, EpisodeStatus.CANCELLED)
JUDGE_RETRY_S = 10.0
"""How soon a `scoring` episode's judge is asked again (the reconciler resends it once this has passed)."""


class GroupStatus(StrEnum):
    """Where a GRPO group is in its life: the one spelling controller, workers, trainer and API share."""

    RUNNING = "running"  # dispatched, some episode still pending or running
    COMPLETE = "complete"  # every episode ended; waiting for the trainer
    CONSUMED = "consumed"  # trained on
    DROPPED = "dropped"  # the trainer discarded it; `episode_groups.drop_reason` says why (DropReason)


class DropReason(StrEnum):
    """Why the trainer did not train on a group: stored on the group (`drop_reason`, with the step that
    decided it), counted per step (`batch/dropped/{reason}`) and shown by the API, CLI and dashboard."""

    ZERO_VARIANCE = "zero_variance"  # every kept sample scored the same: no learning signal (DAPO)
    STALE_CAP = "stale_cap"  # past the hard staleness cap (trainer.selection): the only staleness drop
    NO_TRAINABLE_SAMPLE = "no_trainable_sample"  # fewer than one sample the agent itself ended
    TOO_FEW_SAMPLES = "too_few_samples"  # one sample left of several, the others failed (trainer.selection)
    FAILED = "failed"  # every sample ended by an infrastructure fault
    NON_FINITE = "non_finite"  # its step's loss or gradient norm was not finite: the step was skipped
    CANARY = "canary"  # a hack canary (core/canaries.py): measured, never trained on


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"


class Bucket(StrEnum):
    """A task's difficulty bucket: its pass rate under the policy (controller/pass_rate.py), or UNKNOWN
    while it has none (`tasks.difficulty` NULL). The curriculum weighs dispatch by bucket."""

    EASY = "easy"
    MEDIUM = "medium"
    HARD = "hard"
    UNKNOWN = "unknown"


MEASURED_BUCKETS = (Bucket.EASY, Bucket.MEDIUM, Bucket.HARD)
"""The buckets a pass rate puts a task in (stored in `tasks.difficulty`)."""


class RunPurpose(StrEnum):
    """Why a run exists."""

    TRAIN = "train"
    """The trainer consumes its groups."""
    PASS_RATE = "pass_rate"
    """A filtering job: each task's success rate under a model, never trained on."""
    EVAL = "eval"
    """Held-out scoring of a model, never trained on."""
