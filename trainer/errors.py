"""Errors the trainer package raises on purpose.

    CrucibleError                      (core.errors)
    ├── ConfigError                    a tiny-model or server option out of range
    │   └── ImportRefused              `crucible model import`: a source it cannot read, or a failed check
    ├── ServiceUnavailable
    │   └── ServerStartError           vLLM did not become healthy; carries the log tail
    ├── WeightSyncError                a push failed, or the probe shows vLLM disagrees with the trainer
    ├── NonFiniteStep                  a loss or gradient norm was NaN/inf: the step is skipped
    ├── TrainerAlreadyRunning          another trainer holds the run's lock
    └── PreferenceDataError            a preference pair (JSONL line, mined group) that cannot be trained on
"""

from core.errors import ConfigError, CrucibleError, ServiceUnavailable


class ServerStartError(ServiceUnavailable):
    """The vLLM server exited or timed out before `/health` answered 200."""


class ImportRefused(ConfigError):
    """The source is not a model `crucible model import` can read, or a check on what it read failed."""


class WeightSyncError(CrucibleError):
    """New weights did not reach the policy server, or it scores the probe differently."""


class NonFiniteStep(CrucibleError):
    """A micro-batch loss or a gradient norm was not finite: nothing of the step may be kept."""


class TrainerAlreadyRunning(CrucibleError):
    """Another trainer process holds the run's advisory lock: one trainer per run."""


class PreferenceDataError(CrucibleError):
    """A preference pair (a JSONL line, a mined group) a reward model cannot be trained on."""
