"""The controller's errors (all are `core.errors.CrucibleError`, so the CLI prints one line).

    CrucibleError
    ├── NoEligibleTask     an environment has no task a run may draw (split, pass-rate band, buckets)
    └── InvalidRunState    the run's status does not allow the operation (resume a completed run…)
"""

from core.errors import CrucibleError


class NoEligibleTask(CrucibleError):
    """No task of the environment passes the run's split, pass-rate band and bucket weights."""


class InvalidRunState(CrucibleError):
    """The operation needs the run in another status."""
