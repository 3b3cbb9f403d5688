"""The optimisation backend behind one seam: a `PolicyEngine` protocol, plain PyTorch here, DeepSpeed
ZeRO in `trainer.engine_deepspeed`; `make_engine` picks by config.

    engine = make_engine(model=model, config=trainer_cfg)
    loss = ...; engine.backward(loss)          # any number of micro-batches
    grad_norm = engine.step()                  # clip, optimizer step, schedule, zero grads
    state = engine.export_state_dict()         # full weights under Hugging Face names (LoRA merged)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer.config import TrainerConfig
from trainer.errors import NonFiniteStep
from trainer.lora import is_lora, merged_state_dict

ENGINE_STATE = "engine.pt"


class PolicyEngine(Protocol):
    module: torch.nn.Module
    """The policy as a module: call it for logits; under ZeRO-3 its parameters are partitioned."""

    def __call__(self, **inputs: Any) -> Any: ...

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of `loss` (not scaled any further)."""

    def step(self) -> float:
        """Clip, apply the optimizer and the schedule, zero the gradients; the pre-clip grad norm.
        NonFiniteStep when the norm is NaN/inf (plain PyTorch checks before applying anything)."""
        ...

    def lr(self) -> float: ...

    def save(self, directory: Path) -> None:
        """Weights, optimizer and schedule state into an existing empty directory."""

    def load(self, directory: Path) -> None: ...

    @contextmanager
    def full_weights(self) -> Iterator[torch.nn.Module]:
        """The module with every parameter materialised (gathered under ZeRO-3), for probing."""
        yield self.module

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights under the checkpoint's names, LoRA merged: what vLLM loads."""
        ...


def warmup_factor(step: int, *, warmup_steps: int) -> float:
    """Linear warm-up to 1 over `warmup_steps` optimizer steps, then constant."""
    return 1.0 if warmup_steps <= 0 else min(1.0, (step + 1) / warmup_steps)


def export_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    if is_lora(module):
        return merged_state_dict(module)  # type: ignore[arg-type]
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


class TorchEngine:
    """Plain PyTorch on one device: AdamW, global-norm clipping, linear warm-up."""

    def __init__(self, *, model: torch.nn.Module, config: TrainerConfig) -> None:
        opt = config.optimizer
        self.module = model
        self.max_grad_norm = opt.max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: warmup_factor(step, warmup_steps=opt.warmup_steps))

    def __call__(self, **inputs: Any) -> Any:
        return self.module(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        if not torch.isfinite(norm):  # NaN/inf gradients: apply nothing (the trainer skips the step)
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteStep(f"gradient norm: expected a finite number, got {float(norm)}; nothing applied")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def save(self, directory: Path) -> None:
        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict()}
        torch.save(state, directory / ENGINE_STATE)

    def load(self, directory: Path) -> None:
        state = torch.load(directory / ENGINE_STATE, map_location="cpu", weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    @contextmanager
    def full_weights(self) -> Iterator[torch.nn.Module]:
        yield self.module

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        return export_weights(self.module)


def make_engine(*, model: torch.nn.Module, config: TrainerConfig) -> PolicyEngine:
    """DeepSpeed when the config names it, else plain PyTorch."""
    if config.deepspeed is not None:
        from trainer.engine_deepspeed import DeepSpeedEngine

        return DeepSpeedEngine(model=model, config=config)
    return TorchEngine(model=model, config=config)
