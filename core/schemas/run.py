"""A run's launch config: what `crucible run launch CONFIG` and `POST /v1/runs` accept."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EnvironmentShare(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """Registered environment name."""
    version: int | None = Field(default=None, ge=1)
    """Pinned version; None pins the latest at launch."""
    weight: float = Field(default=1.0, gt=0)
    """Share of the groups dispatched for this environment."""


Bucket = Literal["easy", "medium", "hard", "unknown"]
BUCKETS: tuple[Bucket, ...] = ("easy", "medium", "hard", "unknown")


class Curriculum(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pass_rate_band: tuple[float, float] = (0.1, 0.9)
    """Tasks whose measured pass rate lies outside [low, high] are not trained on."""
    bucket_weights: dict[Bucket, float] = Field(default_factory=lambda: dict.fromkeys(BUCKETS, 1.0))
    """Relative chance of drawing a task from each difficulty bucket."""

    @model_validator(mode="after")
    def _band_is_ordered(self) -> Curriculum:
        low, high = self.pass_rate_band
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"pass_rate_band: expected 0 <= low <= high <= 1, got {self.pass_rate_band}")
        return self


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0.0, le=5.0)
    """Policy sampling temperature (1.0: the logprobs the trainer recomputes are the model's own)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    model: str = Field(min_length=1)
    """The policy model directory (or served model name)."""
    environments: list[EnvironmentShare] = Field(min_length=1)
    purpose: Literal["train", "pass_rate", "eval"] = "train"
    split: str = "train"
    """Which task split episodes are drawn from."""
    group_size: int = Field(default=8, ge=1, le=1024)
    """G: rollouts per task in a group (GRPO normalises rewards within it)."""
    batch_size: int = Field(default=4, ge=1, le=4096)
    """Groups per training step."""
    mode: Literal["sync", "async"] = "async"
    """sync: dispatch a batch, wait for it to be trained on; async: keep generating within the staleness bound."""
    max_staleness: int = Field(default=1, ge=0, le=64)
    """How many policy versions an episode's weights may lag the trainer's (async mode)."""
    max_inflight_groups: int | None = Field(default=None, ge=1)
    """Cap on groups dispatched but not complete; default (max_staleness + 1) × batch_size."""
    max_groups: int | None = Field(default=None, ge=1)
    """Budget: stop dispatching after this many groups."""
    curriculum: Curriculum = Field(default_factory=Curriculum)
    seed: int = 0
    sampling: Sampling = Field(default_factory=lambda: Sampling())
    trainer: dict[str, object] = Field(default_factory=dict)
    """Loss and optimizer settings, validated by the trainer."""

    @property
    def staleness_bound(self) -> int:
        """sync mode is async with no staleness: the next batch waits for the weights of this one."""
        return 0 if self.mode == "sync" else self.max_staleness
