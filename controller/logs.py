"""Structured log lines: `event key=value …`, with the same fields on the record for JSON handlers."""

from __future__ import annotations

import json
import logging
from typing import Any

logger = logging.getLogger("crucible.controller")


def _format(value: Any) -> str:
    if isinstance(value, str) and value and " " not in value and "=" not in value:
        return value
    return json.dumps(value, default=str, separators=(",", ":"))


def log_event(event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log `event` with its fields, e.g. `dispatch.group run_id=3 group_index=7 task_id=12`."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{key}={_format(value)}" for key, value in fields.items())
    logger.log(level, "%s %s", event, text, extra={"event": event, "fields": fields})
