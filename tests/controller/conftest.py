"""Fixtures for controller tests: an in-memory dispatcher and default controller settings."""

from __future__ import annotations

import pytest

from controller.config import ControllerConfig
from controller.dispatcher import RecordingDispatcher


@pytest.fixture
def recorder() -> RecordingDispatcher:
    """Keeps the tasks the controller sends (the real broker is exercised in test_broker_dispatch)."""
    return RecordingDispatcher()


@pytest.fixture
def settings() -> ControllerConfig:
    return ControllerConfig(heartbeat_timeout_s=30.0, max_attempts=3, deadline_slack_s=60.0)
