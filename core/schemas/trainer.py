"""The trainer's settings: what a run's `config.trainer` may hold, validated at submission (the run
config embeds `TrainerConfig`) and again by the trainer (`trainer.config.trainer_config`).

Defaults follow the "Recommended design" of the research notes (research/trainer.md): DAPO
token-level aggregation with clip-higher, Dr. GRPO advantages (no std scaling), decoupled
correction with a truncated importance weight, no KL.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LossConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clip_low: float = Field(default=0.2, ge=0.0, lt=1.0)
    """PPO clip below 1 on u = π_θ/π_prox (DAPO's ε_low)."""
    clip_high: float = Field(default=0.28, ge=0.0)
    """PPO clip above 1 (DAPO's clip-higher ε_high): leaves room for rare tokens to grow."""
    dual_clip: float | None = Field(default=3.0, gt=1.0)
    """Dual clip c (Ye et al. 2020; verl's clip_ratio_c): for A < 0 the objective is bounded below by c·A.
    With several passes (`epochs`, `minibatches`) u moves away from 1, and for A < 0 the PPO objective
    min(uA, clip(u)A) grows without bound in u; past u = c the token costs c·|A| and gives no gradient.
    In one pass without dropout u ≡ 1 and it never binds. None turns it off."""
    tis_cap: float = Field(default=2.0, gt=0.0)
    """Truncated importance weight min(π_prox/π_behav, cap): vLLM-vs-trainer and staleness correction."""
    kl_beta: float = Field(default=0.0, ge=0.0)
    """Weight of the k3 KL to the frozen initial policy; 0 keeps no reference model at all."""
    scale_advantages_by_std: bool = False
    """GRPO's (R − mean)/std; off gives Dr. GRPO's unbiased R − mean."""
    normalize_rewards_per_environment: Literal["auto", "on", "off"] = "auto"
    """z-score each environment's rewards within a batch. Decided per run, never per batch: auto is
    on for a run that mixes environments (even in a batch that happens to hold one), off otherwise."""
    overlong_max_tokens: int | None = Field(default=None, ge=1)
    """DAPO overlong shaping: sampled tokens beyond max − buffer cost up to −1 reward; None turns it off."""
    overlong_buffer_tokens: int = Field(default=256, ge=1)
    """Length of DAPO's soft-penalty buffer below `overlong_max_tokens`."""

    def normalization_for(self, *, environments: int) -> Literal["on", "off"]:
        """The run's normalisation mode: `auto` resolved by how many environments the run mixes."""
        if self.normalize_rewards_per_environment == "auto":
            return "on" if environments >= 2 else "off"
        return self.normalize_rewards_per_environment


class OptimizerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(default=1e-5, gt=0.0)
    """AdamW learning rate, constant after warm-up."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up from 0 over this many steps."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Global gradient-norm clip."""
    epochs: int = Field(default=1, ge=1, le=16)
    """Passes over each batch; >1 makes the PPO clip bite (π_θ moves away from π_prox)."""
    minibatches: int = Field(default=1, ge=1, le=256)
    """Optimizer steps per epoch; each takes an equal share of the batch's sequences."""
    micro_batch_tokens: int | None = Field(default=None, ge=64)
    """Padded tokens per forward/backward; gradients accumulate across micro-batches. None: sized from
    the policy's parameter count (trainer.sizing: 8192 for the tiny models, 2048 for a 135M one), so that
    the decoder's saved activations of one micro-batch stay near 3 GB."""
    activation_checkpointing: bool = False
    """The decoder's layers recompute their activations in backward (Hugging Face's
    `gradient_checkpointing_enable`): one more decoder forward a step for a fraction of the memory
    (a 135M model's step at 8192 tokens a micro-batch: 13.4 GB → 5.2 GB)."""
    autocast: Literal["off", "bf16"] = "off"
    """Forward and backward under bf16 autocast (weights, gradients and optimizer state stay float32).
    Whether it pays depends on the host's kernels (bench/trainer_options.py: 1.21× on one CPU, 0.67× on
    another with the same avx512_bf16 flag): measure where you train. Off by default, also because the
    trainer's logprobs then differ from vLLM's float32 ones by bf16 rounding (the decoupled correction
    absorbs it, but token-exact checks would not hold)."""


class LoraConfig(BaseModel):
    """Every field is applied (trainer.lora.apply_lora); a target module the model lacks is refused."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(default=8, ge=1, le=256)
    alpha: float = Field(default=16.0, gt=0.0)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input while training (the probe and vLLM never apply it)."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)


class DeepSpeedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: Literal[2, 3] = 2
    """ZeRO stage: 2 partitions optimizer state and gradients, 3 the parameters too."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Merged into the generated DeepSpeed config (e.g. offload settings)."""


class TrainerConfig(BaseModel):
    """`runs.config["trainer"]`: loss, optimizer and the training backend."""

    model_config = ConfigDict(extra="forbid")

    loss: LossConfig = Field(default_factory=LossConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    lora: LoraConfig | None = None
    """Train a LoRA adapter instead of every weight (vLLM receives the merged weights)."""
    deepspeed: DeepSpeedConfig | None = None
    """Train under DeepSpeed ZeRO; None is plain PyTorch on one device."""
    weight_sync: Literal["reload", "nccl"] = "reload"
    """How new weights reach vLLM (trainer.weight_sync registry)."""
    served_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The dtype the policy servers serve in (vLLM's `--dtype`): it sets the probe's tolerance."""
    probe_tolerance: float | None = Field(default=None, gt=0.0)
    """Mean |Δlogprob| the probe may show after a push before the sync counts as failed; None: the
    served dtype's (trainer.probe.probe_tolerance: float32 1e-3, bfloat16 1e-2, float16 2e-3)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Checkpoints kept on disk; older ones are deleted after a newer one is complete."""
    keep_every: int | None = Field(default=None, ge=1)
    """Also keep every checkpoint whose step is a multiple of this, to evaluate it later (`crucible eval
    launch --run R --step S`); None: only the newest `keep_checkpoints`."""
    seed: int | None = None
    """The trainer's torch seed (initialisation, dropout); None: the run's seed, made explicit at launch
    (controller.runs.resolve_config)."""

    @model_validator(mode="after")
    def _lora_and_zero3(self) -> TrainerConfig:
        if self.lora is not None and self.deepspeed is not None and self.deepspeed.stage == 3:
            raise ValueError("lora with deepspeed stage 3: expected stage 2 (ZeRO-3 partitions the base weights)")
        return self
