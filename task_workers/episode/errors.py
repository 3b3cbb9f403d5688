"""Faults that are the infrastructure's, not the agent's: the episode is retried, never trained on.

    InfrastructureFault
    ├── SandboxFault   the sandbox died, could not be created, or the task could not be set up
    ├── PolicyFault    the policy server failed after its retries
    └── JudgeFault     the judge layer's server failed after its retries
"""

from core.termination import TerminationReason


class InfrastructureFault(RuntimeError):
    reason = TerminationReason.SANDBOX_ERROR


class SandboxFault(InfrastructureFault):
    reason = TerminationReason.SANDBOX_ERROR


class PolicyFault(InfrastructureFault):
    reason = TerminationReason.POLICY_ERROR


class JudgeFault(InfrastructureFault):
    """A grading fault of the machine's, as a verifier's (GraderFault → SandboxFault): same reason."""

    reason = TerminationReason.SANDBOX_ERROR
