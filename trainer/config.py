"""The trainer's settings: what a run's `config.trainer` may hold, validated, every default explained.

    config = trainer_config(run.config.get("trainer", {}))   # ConfigError naming the field on a bad value

The schema lives in `core.schemas.trainer` so that a run config is refused at submission (API/CLI)
for a bad trainer value, not when the trainer starts.
"""

from __future__ import annotations

from typing import Any

from core.config_files import parse_model
from core.schemas.trainer import DeepSpeedConfig, LoraConfig, LossConfig, OptimizerConfig, TrainerConfig

__all__ = ["DeepSpeedConfig", "LoraConfig", "LossConfig", "OptimizerConfig", "TrainerConfig", "trainer_config"]


def trainer_config(data: Any, *, source: str = "trainer config") -> TrainerConfig:
    """Validate `data` (a run's `config["trainer"]`); ConfigError with one line per bad field."""
    return parse_model(TrainerConfig, data, source=source)
