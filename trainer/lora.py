"""LoRA through peft: wrap the policy, and export merged full weights for vLLM without touching the
trainable ones (W + ΔW computed on the side, so repeated syncs never accumulate merge/unmerge error).
"""

from __future__ import annotations

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model

from core.errors import ConfigError
from trainer.config import LoraConfig


def apply_lora(model: torch.nn.Module, *, config: LoraConfig) -> PeftModel:
    """Every option applied: rank, alpha, dropout, targets (a target the model lacks is refused,
    where peft would skip it silently as long as another one matches)."""
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [target for target in config.target_modules if target not in leaves]
    if missing:
        raise ConfigError(f"lora.target_modules: expected module names of the model, got {missing} "
                          f"(it has e.g. {sorted(leaves - {''})[:12]})")
    peft_config = PeftLoraConfig(
        r=config.rank, lora_alpha=config.alpha,  # type: ignore[arg-type]  # peft accepts floats
        lora_dropout=config.dropout, target_modules=list(config.target_modules), bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)  # type: ignore[arg-type]


def is_lora(model: torch.nn.Module) -> bool:
    return isinstance(model, PeftModel)


@torch.no_grad()
def merged_state_dict(model: PeftModel) -> dict[str, torch.Tensor]:
    """The base model's state dict under its own (Hugging Face) names, every LoRA delta added in."""
    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            for adapter in getattr(module, "active_adapters", []):
                delta = module.get_delta_weight(adapter)
                deltas[f"{name}.weight"] = deltas.get(f"{name}.weight", 0) + delta
    state: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        if "lora_" in key:
            continue
        clean = key.replace(".base_layer.", ".")
        state[clean] = tensor + deltas[clean] if clean in deltas else tensor
    return state
