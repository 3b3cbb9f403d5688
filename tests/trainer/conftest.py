"""Fixtures for the trainer tests: one tiny model per session, one real vLLM (CPU) server per module."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from trainer.serving import VllmServer, group_members
from trainer.tiny_model import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly made tiny model (seed 0, default spec). Read-only: copy it before changing it."""
    return make_tiny_model(out_dir=tmp_path_factory.mktemp("tiny") / "model", seed=0).path


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def served_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny model for the server: weight sync rewrites its safetensors."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("served") / "model"))


@pytest.fixture(scope="module")
def vllm_server(served_model_dir: Path) -> Iterator[VllmServer]:
    """A real vLLM server (float32, eager) on a free port; started once per module, always stopped."""
    log_path = served_model_dir.parent / "server.log"
    with VllmServer(model_dir=served_model_dir, served_model_name="tiny", max_model_len=1024,
                    log_path=log_path) as server:
        yield server
    assert server.pid is not None and group_members(server.pid) == [], "vLLM processes outlived stop()"


@pytest.fixture
def trainer_model(tiny_model_dir: Path) -> PreTrainedModel:
    """The trainer's copy of the weights the server started with (read from the untouched original)."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
