"""The controller's own knobs, and run configs read from files or back from the database.

    config = load_run_config(Path("run.yaml"))      # YAML or JSON → RunConfig, or one-line ConfigError
    config = stored_run_config(run)                  # the fully resolved config a run was created with
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.config_files import load_model_file, parse_model
from core.models import Run
from core.models.worker import HEARTBEAT_TIMEOUT_S
from core.schemas import RunConfig

JOB_KEY = "job"
"""Key of `runs.config` holding what a job (e.g. a pass-rate job) needs beyond the RunConfig."""


class ControllerConfig(BaseModel):
    """How the controller judges lost work. Defaults suit workers that beat every 5 s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    heartbeat_timeout_s: float = Field(default=HEARTBEAT_TIMEOUT_S, gt=0)
    """A worker whose last heartbeat is older than this is dead: its overdue episodes are `worker_lost`."""
    max_attempts: int = Field(default=3, ge=1)
    """Times an episode may be lost before it is marked failed (`worker_lost`)."""
    deadline_slack_s: float = Field(default=120.0, ge=0)
    """Added to the environment's episode_timeout_s to get an episode's deadline (queueing, grading)."""
    max_groups_per_pass: int = Field(default=64, ge=1)
    """Most groups one run dispatches in one controller pass, so one run cannot starve the others."""


def parse_run_config(data: Any, *, source: str = "run config") -> RunConfig:
    return parse_model(RunConfig, data, source=source)


def load_run_config(path: Path) -> RunConfig:
    """Read a YAML or JSON run config; every problem is a ConfigError naming the file and the field."""
    return load_model_file(RunConfig, path, what="run config")


def stored_run_config(run: Run) -> RunConfig:
    """The resolved RunConfig stored at creation (versions pinned, defaults filled in)."""
    fields = {key: value for key, value in run.config.items() if key != JOB_KEY}
    return parse_run_config(fields, source=f"run {run.id} config")


def job_config(run: Run) -> dict[str, Any]:
    return dict(run.config.get(JOB_KEY) or {})
