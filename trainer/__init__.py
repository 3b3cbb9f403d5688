"""Async GRPO trainer and the policy-serving plumbing it drives.

    crucible trainer --run 7 --policy-url http://127.0.0.1:8000/v1 --policy-dir /data/served

A step, one module each: `step.generate` (claim complete groups: `store`, read rollouts: `rollouts`,
plan the batch: `selection`) → `step.score` / `step.advantages` (`advantages`) → `step.update`
(`packing`, `logprobs`, `loss`, an `engine`) → checkpoint (`checkpoint`) + record → sync (`sync`).

- `loop`: `Trainer`, resume and the step loop; `config`: `TrainerConfig` (a run's `config.trainer`).
- `engine` / `engine_deepspeed`: `PolicyEngine` (plain PyTorch, DeepSpeed ZeRO-2/3); `lora`: peft.
- `metrics`: every metric name; `faults`: crash points for the resume tests; `sft`: warm-up SFT.
- `tiny_model`: make a tiny local Qwen2 model + tokenizer + chat template (`crucible model init-tiny`).
- `serving`: `VllmServer`, vLLM's OpenAI server as an owned child process (`crucible serve`).
- `weight_sync`: `WeightSyncer` protocol and registry; `reload` (CPU) and `nccl` (GPU) paths.
- `probe`: score a fixed token sequence on trainer and server; `verify_sync` after every push.
- `errors`: `ServerStartError`, `WeightSyncError`.
"""
