"""The controller's own knobs, and run configs read from files or back from the database.

    config = load_run_config(Path("run.yaml"))      # YAML or JSON → RunConfig, or one-line ConfigError
    config = stored_run_config(run)                  # the fully resolved config a run was created with
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import ConfigError
from core.models import Run
from core.schemas import RunConfig

JOB_KEY = "job"
"""Key of `runs.config` holding what a job (e.g. a pass-rate job) needs beyond the RunConfig."""


class ControllerConfig(BaseModel):
    """How the controller judges lost work. Defaults suit workers that beat every 5 s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    """A worker whose last heartbeat is older than this is dead: its overdue episodes are `worker_lost`."""
    max_attempts: int = Field(default=3, ge=1)
    """Times an episode may be lost before it is marked failed (`worker_lost`)."""
    deadline_slack_s: float = Field(default=120.0, ge=0)
    """Added to the environment's episode_timeout_s to get an episode's deadline (queueing, grading)."""
    max_groups_per_pass: int = Field(default=64, ge=1)
    """Most groups one run dispatches in one controller pass, so one run cannot starve the others."""


def _describe(error: ValidationError, source: str) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "config"
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message} (got {item.get('input')!r})")
    return f"{source}: " + "; ".join(parts)


def parse_run_config(data: Any, *, source: str = "run config") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, source)) from None


def load_run_config(path: Path) -> RunConfig:
    """Read a YAML or JSON run config; every problem is a ConfigError naming the file and the field."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the run config ({error.strerror})") from None
    is_json = path.suffix == ".json"
    try:
        data = json.loads(text) if is_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        detail = " ".join(str(error).split())
        raise ConfigError(f"{path}: expected valid {'JSON' if is_json else 'YAML'}: {detail}") from None
    return parse_run_config(data, source=str(path))


def stored_run_config(run: Run) -> RunConfig:
    """The resolved RunConfig stored at creation (versions pinned, defaults filled in)."""
    fields = {key: value for key, value in run.config.items() if key != JOB_KEY}
    return parse_run_config(fields, source=f"run {run.id} config")


def job_config(run: Run) -> dict[str, Any]:
    return dict(run.config.get(JOB_KEY) or {})
