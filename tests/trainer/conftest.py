"""Fixtures for the trainer tests. The tiny model, its tokenizer and the session's vLLM server are in
tests/conftest.py (one per session, shared with every package)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, PreTrainedModel


@pytest.fixture
def trainer_model(tiny_model_dir: Path) -> PreTrainedModel:
    """The trainer's copy of the weights the server started with (read from the untouched original)."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
