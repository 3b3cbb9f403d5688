"""DeepSpeed ZeRO-2/3 behind the `PolicyEngine` seam. Works on CPU over gloo (single or multi rank).

Gradient accumulation is ours, not DeepSpeed's (`managed_gradient_accumulation: false`): a step may
have any number of micro-batches, each `backward` only accumulates, `step()` is the boundary. The
loss arrives already divided by the batch's active-token count, so it is not scaled again
(`scale_wrt_gas=False`).

A single process with no launcher gets a one-rank gloo group on a free loopback port.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from core.settings import get_settings
from trainer.config import TrainerConfig
from trainer.engine import export_weights, warmup_factor
from trainer.errors import NonFiniteStep

CHECKPOINT_TAG = "zero"


def join_process_group() -> None:
    """Join the process group a launcher (torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT) describes, or
    without one create a one-rank group on loopback. gloo on CPU, NCCL on GPU."""
    import datetime

    import deepspeed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    if "RANK" not in os.environ:
        from core.net import free_port

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
    timeout = datetime.timedelta(seconds=get_settings().trainer_rank_timeout_s)
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl", timeout=timeout)


def deepspeed_config(config: TrainerConfig) -> dict[str, Any]:
    assert config.deepspeed is not None
    opt = config.optimizer
    generated: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,  # nominal: micro-batches are ours (see module doc)
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "zero_optimization": {"stage": config.deepspeed.stage},
        "optimizer": {"type": "AdamW", "params": {
            "lr": opt.lr, "betas": list(opt.betas), "weight_decay": opt.weight_decay,
            "torch_adam": True,  # no FusedAdam/CPUAdam build: torch's AdamW
        }},
        "gradient_clipping": opt.max_grad_norm,
        "bf16": {"enabled": False},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    return _merge(generated, config.deepspeed.extra)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class DeepSpeedEngine:
    def __init__(self, *, model: torch.nn.Module, config: TrainerConfig) -> None:
        import deepspeed

        join_process_group()
        assert config.deepspeed is not None
        self.stage = config.deepspeed.stage
        warmup = config.optimizer.warmup_steps

        def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_factor(step, warmup_steps=warmup))

        self.engine, _, _, _ = deepspeed.initialize(
            model=model, config=deepspeed_config(config), lr_scheduler=schedule,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
        )
        self.module = self.engine.module

    def __call__(self, **inputs: Any) -> Any:
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        value = float(norm) if norm is not None else float("nan")
        if not math.isfinite(value):  # DeepSpeed has applied it: the trainer restores the last checkpoint
            raise NonFiniteStep(f"gradient norm: expected a finite number, got {value}")
        return value

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag=CHECKPOINT_TAG, save_latest=False)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag=CHECKPOINT_TAG)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}/{CHECKPOINT_TAG}")

    @contextmanager
    def full_weights(self) -> Iterator[torch.nn.Module]:
        if self.stage != 3:
            yield self.module
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            yield self.module

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        with self.full_weights() as module:
            return export_weights(module)  # cloned inside: ZeRO-3 empties the gathered tensors on exit
