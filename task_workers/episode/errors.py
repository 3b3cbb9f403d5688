"""Faults that are the infrastructure's, not the agent's: the episode is retried, never trained on.

    InfrastructureFault
    ├── SandboxFault   the sandbox died, could not be created, or the task could not be set up
    │   └── TaskRefusedFault   the task itself is unfit (its image holds the answer): not retried
    ├── PolicyFault    the policy server failed after its retries
    └── JudgeFault     a judge's or reward model's server failed after its retries (judge_error)
"""

from core.termination import TerminationReason


class InfrastructureFault(RuntimeError):
    reason = TerminationReason.SANDBOX_ERROR
    retry = True
    """False: retrying cannot help (the task itself was refused); the episode fails at once."""


class SandboxFault(InfrastructureFault):
    reason = TerminationReason.SANDBOX_ERROR


class TaskRefusedFault(SandboxFault):
    """The task was refused at setup (environments.base.TaskRefused): failed at once, not retried."""

    retry = False


class PolicyFault(InfrastructureFault):
    reason = TerminationReason.POLICY_ERROR


class UnreachablePool(PolicyFault):
    """The run samples from servers of its own that this caller has no way to reach: retrying here
    cannot help."""

    retry = False


class JudgeFault(InfrastructureFault):
    """A learned layer's server (judge, reward model) did not answer after its client's retries. Pointwise,
    the runner keeps the episode, failed and unscored (judge_error); pairwise, the group's judging is
    retried by the task (its episodes have ended: nothing is sampled again)."""

    reason = TerminationReason.JUDGE_ERROR
