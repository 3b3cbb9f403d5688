"""Async GRPO trainer and the policy-serving plumbing it drives.

- `tiny_model`: make a tiny local Qwen2 model + tokenizer + chat template (`crucible model init-tiny`).
- `serving`: `VllmServer`, vLLM's OpenAI server as an owned child process (`crucible serve`).
- `weight_sync`: `WeightSyncer` protocol and registry; `reload` (CPU) and `nccl` (GPU) paths.
- `probe`: score a fixed token sequence on trainer and server; `verify_sync` after every push.
- `errors`: `ServerStartError`, `WeightSyncError`.
"""
