"""The model a recipe trains: the tiny one it makes (the default), or a directory given with `--model`
(safetensors weights, a tokenizer and its chat template: what `crucible model import` writes), and the
resources sized from that model (`sizing_for`): the trainer's micro-batch and activation checkpointing,
the served dtype, vLLM's KV cache and cores.

    .venv/bin/python -m recipes.demo --model ~/models/SmolLM2-135M-Instruct --sft-steps 100

A given model is pretrained: its warm-up and RL learning rates are those of fine-tuning,
not the tiny model's, which starts from random weights (`PRETRAINED_*`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.errors import ConfigError
from trainer.sizing import training_sizing

LARGE = 100_000_000
"""From this many parameters a model is served on every core (a tiny one on vLLM's own share, which keeps
a core back for its scheduler)."""
SERVED_DTYPE: Literal["float32", "bfloat16"] = "float32"
"""Every model is served in float32, as the trainer computes. bfloat16 serving would be faster, but on
SmolLM2-135M-Instruct its logprobs are another model's: the trainer's first push of the warmed-up model
to a bfloat16 vLLM was refused by the probe at mean |Δlogprob| 0.12, max 1.75, KL ≈ 0.059 over 270
tokens (bfloat16's tolerance is 0.01), since the weights themselves round to bfloat16 on the server."""
PRETRAINED_SFT_LR, PRETRAINED_SLOPPY_LR, PRETRAINED_LR = 3e-5, 1e-5, 2e-6
"""A pretrained model's learning rates (warm-up, sloppy warm-up, RL): fine-tuning, not training from
scratch (the tiny model's are 3e-3, 3e-4 and 1e-4)."""
KV_HEADROOM = 2
"""KV cache for this many times the tokens of every sequence the worker runs at once, at full length."""
WORKER_SEQUENCES = 4
"""Sequences vLLM serves at once: the recipes' worker concurrency (recipes.common.Processes)."""


def missing_parts(directory: Path) -> list[str]:
    """What `directory` lacks to be a model a recipe can train and serve (empty: nothing)."""
    if not directory.is_dir():
        return ["the directory itself"]
    missing = [] if (directory / "config.json").is_file() else ["config.json"]
    if not any(directory.glob("*.safetensors")):
        missing.append("*.safetensors weights")
    if not any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        missing.append("a tokenizer (tokenizer.json or tokenizer.model)")
    if not _has_chat_template(directory):
        missing.append("a chat template (chat_template.jinja, or chat_template in tokenizer_config.json)")
    return missing


def _has_chat_template(directory: Path) -> bool:
    if (directory / "chat_template.jinja").is_file() or (directory / "chat_template.json").is_file():
        return True
    config = directory / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text()).get("chat_template")) if config.is_file() else False
    except (OSError, ValueError, AttributeError):
        return False


def checked_model_dir(directory: Path) -> Path:
    """`directory` resolved, or ConfigError: one line naming what a model directory holds and what is missing."""
    if missing := missing_parts(directory):
        given = "got no such directory" if not directory.is_dir() else f"missing {', '.join(missing)}"
        raise ConfigError(f"{directory}: expected a model directory (config.json, *.safetensors weights, a tokenizer "
                          f"and its chat template, as `crucible model import` writes), {given}")
    return directory.resolve()


def parameter_count(directory: Path) -> int:
    """Parameters in the directory's safetensors files, read from their headers (no weight loaded; a tied
    head stored once counts once)."""
    from safetensors import safe_open

    config = json.loads((directory / "config.json").read_text()) if (directory / "config.json").is_file() else {}
    # A tied head written beside the embeddings (trainer.weight_sync.save_weights) is the same matrix.
    skip = {"lm_head.weight"} if config.get("tie_word_embeddings") else set()
    total = 0
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            total += sum(math.prod(weights.get_slice(name).get_shape())
                         for name in weights.keys() if name not in skip)  # noqa: SIM118
    return total


def kv_bytes_per_token(config: dict[str, Any], *, dtype_bytes: int) -> int | None:
    """Keys and values of one token over every layer, from a decoder's config.json (None: not a shape we know)."""
    try:
        layers, heads, hidden = config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or hidden // heads
        return int(2 * layers * kv_heads * head_dim * dtype_bytes)
    except (KeyError, TypeError, ZeroDivisionError):
        return None


@dataclass(frozen=True)
class ModelSizing:
    parameters: int
    micro_batch_tokens: int
    """The trainer's padded tokens per forward/backward (trainer.sizing)."""
    activation_checkpointing: bool
    served_dtype: Literal["float32", "bfloat16"]
    """vLLM's `--dtype`, and the trainer's `served_dtype` (the probe's tolerance follows it)."""
    kv_cache_gib: int
    serving_cores: tuple[int, ...] | None
    """vLLM's cores; None: its own binding (a core kept back for its scheduler)."""

    def trainer_config(self, *, lr: float) -> dict[str, Any]:
        """The run's `config.trainer`."""
        return {"optimizer": {"lr": lr, "micro_batch_tokens": self.micro_batch_tokens,
                              "activation_checkpointing": self.activation_checkpointing},
                "served_dtype": self.served_dtype}


def sizing_for(*, parameters: int, config: dict[str, Any] | None = None, max_model_len: int,
               cores: tuple[int, ...] | None = None) -> ModelSizing:
    """Resources for a model of `parameters` (its config.json, for the KV cache's shape) serving sequences
    of up to `max_model_len` tokens; `cores`: the machine's (default: this process's affinity)."""
    trainer = training_sizing(parameters=parameters)
    large = parameters >= LARGE
    dtype: Literal["float32", "bfloat16"] = SERVED_DTYPE
    per_token = kv_bytes_per_token(config or {}, dtype_bytes=4)
    needed = (per_token or 0) * max_model_len * WORKER_SEQUENCES * KV_HEADROOM
    return ModelSizing(
        parameters=parameters, micro_batch_tokens=trainer.micro_batch_tokens,
        activation_checkpointing=trainer.activation_checkpointing, served_dtype=dtype,
        kv_cache_gib=max(1, math.ceil(needed / (1 << 30))),
        serving_cores=tuple(sorted(cores or os.sched_getaffinity(0))) if large else None)


def model_sizing(directory: Path, *, max_model_len: int) -> ModelSizing:
    """`sizing_for` the model in `directory` (checked first)."""
    directory = checked_model_dir(directory)
    config = json.loads((directory / "config.json").read_text())
    return sizing_for(parameters=parameter_count(directory), config=config, max_model_len=max_model_len)
