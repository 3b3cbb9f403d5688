"""Which trainer speed options pay on this machine: each against the default update, paired; ONE JSON object.

    .venv/bin/python bench/trainer_options.py [--pairs 5] [--steps 3] [--samples 16] [--prompt-len 192] \
        [--min-completion 16] [--max-completion 256] [--threads 1]

The batch is what padding hurts most: `--samples` sequences of a `--prompt-len` prompt and a completion
of uniformly random length in [`--min-completion`, `--max-completion`] (seeded), on the tiny Qwen2
model, float32 weights, one torch thread. Every option is compared with the default update
(`trainer.step.update`: padded micro-batches of at most `micro_batch_tokens`, none shorter than half
its longest, the output layer only at sampled positions; the proximal logprobs are the policy
forward's own, detached — one forward per step when the data are on-policy), as `--pairs` interleaved
(default, option) pairs in one process:

- `packing`: samples end to end in rows of at most 2 × the longest sample (`trainer/packed.py`), no
  padding token computed; attention is block-diagonal through position ids.
- `activation_checkpointing`: the decoder layers recompute their activations in the backward pass
  (Hugging Face's `gradient_checkpointing_enable`): memory for compute.
- `bf16_autocast`: the trainer's `optimizer.autocast: bf16` — forward and backward under
  `torch.autocast(dtype=torch.bfloat16)`, the loss, weights and optimizer state in float32.

Timed on both sides: `--steps` optimizer updates (forward, loss, backward, clip, optimizer step) after
one warm-up update; tokens counted from what ran (real tokens: equal on both sides, checked). Each
option's first update from the same weights on the same batch reports its loss next to the
default's (`loss_abs_diff`; packing must agree to float32 rounding, bf16 to bf16's). The figure per
option is the median paired ratio (option tokens/s ÷ default tokens/s) with min and max; `pays`
is true when even the worst pair is faster.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from transformers import AutoModelForCausalLM

from bench.pairs import interleave, paired_summary
from trainer.config import TrainerConfig
from trainer.engine import TorchEngine
from trainer.loss import TokenTensors, policy_loss
from trainer.packed import pack, packed_token_logprobs
from trainer.rollouts import Sample
from trainer.step import update
from trainer.tiny_model import make_tiny_model

CONFIG = {"optimizer": {"lr": 1e-5, "max_grad_norm": 1.0, "micro_batch_tokens": 8192},
          "loss": {"clip_low": 0.2, "clip_high": 0.28, "kl_beta": 0.0}}
OPTIONS = ("packing", "activation_checkpointing", "bf16_autocast")


def make_batches(*, count: int, samples: int, prompt_len: int, completions: tuple[int, int], vocab: int,
                 seed: int = 0) -> list[list[Sample]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        batch = []
        for index in range(samples):
            completion = rng.randint(*completions)
            tokens = [rng.randrange(3, vocab) for _ in range(prompt_len + completion)]
            sample = Sample(episode_id=index, group_id=index // 4, environment="bench", status="completed",
                            termination="submitted", reward=0.0, components={}, policy_version=0, token_ids=tokens,
                            loss_mask=[0] * prompt_len + [1] * completion,
                            behaviour_logprobs=[0.0] * prompt_len + [-7.6] * completion)
            sample.advantage = rng.uniform(-1.0, 1.0)
            batch.append(sample)
        out.append(batch)
    return out


def packed_update(engine: TorchEngine, samples: list[Sample], *, config: TrainerConfig) -> tuple[float, int]:
    """One on-policy optimizer step over packed rows: (loss, real tokens)."""
    engine.module.train()
    rows = pack(samples, max_tokens=2 * max(len(s.token_ids) for s in samples))
    total = int(sum(float(row.mask.sum()) for row in rows))
    value, tokens = 0.0, 0
    for row in rows:
        logp, entropy = packed_token_logprobs(engine.module, row, with_entropy=True)
        tensors = TokenTensors(logp=logp, prox_logp=logp.detach(), behav_logp=row.behav_logp,
                               advantages=row.advantages, mask=row.mask, entropy=entropy)
        loss, _ = policy_loss(tensors, total_tokens=total, loss=config.loss)
        engine.backward(loss)
        value += float(loss.detach())
        tokens += row.real_tokens
    engine.step()
    return value, tokens


def measure(model_dir: Path, batches: list[list[Sample]], *, option: str | None) -> dict[str, Any]:
    autocast = "bf16" if option == "bf16_autocast" else "off"  # the trainer's own setting
    config = TrainerConfig.model_validate({**CONFIG, "optimizer": {**CONFIG["optimizer"], "autocast": autocast}})
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if option == "activation_checkpointing":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine = TorchEngine(model=model, config=config)

    def step(samples: list[Sample]) -> tuple[float, int]:
        if option == "packing":
            return packed_update(engine, samples, config=config)
        result = update(engine, samples, config=config)
        return result.loss, result.tokens_processed

    first_loss, _ = step(batches[0])  # warm-up, and the same-work check
    tokens, seconds = 0, 0.0
    for samples in batches[1:]:
        started = time.perf_counter()
        _, counted = step(samples)
        seconds += time.perf_counter() - started
        tokens += counted
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "first_loss": first_loss}


def _parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The benchmark's options, checked (argparse exits on a bad one), and the speed options to compare."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="timed updates per measurement, after one warm-up")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=192)
    parser.add_argument("--min-completion", type=int, default=16)
    parser.add_argument("--max-completion", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--options", default=",".join(OPTIONS), help=f"comma-separated, of {', '.join(OPTIONS)}")
    args = parser.parse_args(argv)
    for name in ("pairs", "steps", "samples", "prompt_len", "min_completion", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    if args.max_completion < args.min_completion:
        parser.error(f"--max-completion: expected ≥ --min-completion ({args.min_completion}), got {args.max_completion}")
    options = [o for o in args.options.split(",") if o]
    unknown = [o for o in options if o not in OPTIONS]
    if unknown or not options:
        parser.error(f"--options: expected some of {', '.join(OPTIONS)}, got {args.options!r}")
    return args, options


def _compare(option: str, *, model_dir: Path, batches: list[list[Sample]], pairs: int) -> dict[str, Any]:
    """`pairs` interleaved (default, option) measurements: the paired speedup and the first updates' loss gap."""
    sides: dict[str, Callable[[], dict[str, Any]]] = {
        "default": lambda: measure(model_dir, batches, option=None),
        option: lambda: measure(model_dir, batches, option=option)}
    runs = interleave(pairs=pairs, sides=sides)
    unequal = [(a["tokens"], b["tokens"]) for a, b in zip(runs[option], runs["default"], strict=True)
               if a["tokens"] != b["tokens"]]
    if unequal:
        raise SystemExit(f"{option}: unequal work (option, default tokens): {unequal}")
    summary = paired_summary(runs[option], runs["default"], key="tokens_per_s")
    return {
        "speedup": {"median": summary["ratio_median"], "min": summary["ratio_min"],
                    "max": summary["ratio_max"], "per_pair": summary["ratios"]},
        "pays": summary["ratio_min"] > 1.0,
        "option_tokens_per_s_p50": round(summary["a_p50"], 1),
        "default_tokens_per_s_p50": round(summary["b_p50"], 1),
        "loss_abs_diff": abs(runs[option][0]["first_loss"] - runs["default"][0]["first_loss"]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, options = _parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        info = make_tiny_model(out_dir=Path(tmp) / "model", seed=0)
        batches = make_batches(count=args.steps + 1, samples=args.samples, prompt_len=args.prompt_len,
                               completions=(args.min_completion, args.max_completion), vocab=info.vocab_size)
        for option in options:
            results[option] = _compare(option, model_dir=info.path, batches=batches, pairs=args.pairs)
    lengths = [len(s.token_ids) for s in batches[0]]
    out = {
        "benchmark": "trainer_options_vs_default_update",
        "command": "bench/trainer_options.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version()},
        "model": {"parameters": info.parameters, "vocab": info.vocab_size},
        "batch": {"samples": args.samples, "real_tokens": sum(lengths), "longest": max(lengths),
                  "padded_tokens_if_one_row_each": args.samples * max(lengths)},
        "window": "both sides: --steps optimizer updates after one warm-up; real tokens counted and equal",
        "order": "per option: interleaved (default, option), (option, default), … in one process",
        "options": results,
    }
    sys.stdout.write(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    main()
