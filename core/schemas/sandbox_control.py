"""What a caller asks a worker's sandbox control service (task_workers/control.py) for, through the API
(api/routes/sandboxes.py): one shape for both."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SandboxExec(BaseModel):
    """A command to run in a sandbox on whichever host holds it."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, max_length=65536)
    """Shell text, run in a shell of its own in the sandbox (as its user, in its workdir)."""
    timeout_s: float | None = Field(default=None, gt=0, le=600)
    """Default: the sandbox's command_timeout_s."""
