"""Fixtures for the trainer tests: one tiny model per session, one real vLLM (CPU) server per module."""

from __future__ import annotations

import json
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


# What a real model ships (Qwen: top_k 20, repetition penalty 1.05), made hostile: a server that applied
# any of it would sample from a distribution the trainer does not compute, and every test below that
# matches vLLM's logprobs to the trainer's would fail.
HOSTILE_GENERATION_CONFIG = {"do_sample": True, "temperature": 0.3, "top_k": 3, "top_p": 0.5, "min_p": 0.2,
                             "repetition_penalty": 1.5}


@pytest.fixture(scope="module")
def served_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny model for the server (weight sync rewrites its safetensors), with hostile
    generation defaults (HOSTILE_GENERATION_CONFIG) that the server must ignore."""
    served = Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("served") / "model"))
    config = json.loads((served / "generation_config.json").read_text())
    (served / "generation_config.json").write_text(json.dumps({**config, **HOSTILE_GENERATION_CONFIG}))
    return served


@pytest.fixture(scope="module")
def vllm_server(served_model_dir: Path) -> Iterator[VllmServer]:
    """A real vLLM server (float32, eager) on a free port; started once per module, always stopped."""
    log_path = served_model_dir.parent / "server.log"
    # A generous start-up limit: on 2 shared cores under load vLLM has been seen to need > 240 s.
    with VllmServer(model_dir=served_model_dir, served_model_name="tiny", max_model_len=1024,
                    log_path=log_path, startup_timeout_s=600) as server:
        yield server
    assert server.pid is not None and group_members(server.pid) == [], "vLLM processes outlived stop()"


@pytest.fixture
def trainer_model(tiny_model_dir: Path) -> PreTrainedModel:
    """The trainer's copy of the weights the server started with (read from the untouched original)."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
