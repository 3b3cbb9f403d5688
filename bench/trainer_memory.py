"""Peak memory of one trainer update at a real model's size; prints ONE JSON object.

    .venv/bin/python bench/trainer_memory.py                  # SmolLM2-135M's shapes, random weights
    .venv/bin/python bench/trainer_memory.py --model DIR      # a model directory (`crucible model import`)

What is measured: one `trainer.step.update` (forward with logprobs and entropy, loss, backward, optimizer
step) on 16 agent rollouts of ~600 tokens (4 turns of 40-80 environment tokens then 60-120 sampled ones,
random token ids), float32, 2 torch threads. Each configuration runs in a fresh process of its own, one
after the other, so each peak is its own: the process's peak resident set (`ru_maxrss`) minus its
resident set just before the update, and the peak itself.

- `sized`: the trainer's defaults (the micro-batch sized from the parameter count, trainer/sizing.py;
  the output layer's logits chunked, trainer/logprobs.py);
- `micro_batch_8192`: the micro-batch every model got before sizing (8192 padded tokens), logits chunked.

Memory, not time: the seconds are printed for the record only (these machines are shared).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROLLOUTS, TURNS = 16, 4
SMOLLM2_135M: dict[str, Any] = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
                "max_position_embeddings": 8192, "rms_norm_eps": 1e-5}
CONFIGURATIONS = {"sized": None, "micro_batch_8192": 8192}


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(*, model_dir: Path | None, micro_batch_tokens: int | None, threads: int) -> dict[str, Any]:
    """One update in this process: its peak memory above the resident set before it, and the peak."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from trainer.config import TrainerConfig
    from trainer.engine import TorchEngine
    from trainer.rollouts import Sample
    from trainer.step import update

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if model_dir is None:
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).float()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = model.config.vocab_size
    rng = random.Random(0)
    samples = []
    for index in range(ROLLOUTS):
        ids: list[int] = []
        mask: list[int] = []
        for _ in range(TURNS):
            env, sampled = rng.randint(40, 80), rng.randint(60, 120)
            ids += [rng.randrange(3, vocab) for _ in range(env + sampled)]
            mask += [0] * env + [1] * sampled
        sample = Sample(episode_id=index, group_id=index // 4, environment="bench", status="completed",
                        termination="submitted", reward=0.0, components={}, policy_version=0, token_ids=ids,
                        loss_mask=mask, behaviour_logprobs=[-7.0 if m else 0.0 for m in mask])
        sample.advantage = rng.uniform(-1, 1)
        samples.append(sample)
    optimizer: dict[str, Any] = {"lr": 1e-5}
    if micro_batch_tokens is not None:
        optimizer["micro_batch_tokens"] = micro_batch_tokens
    config = TrainerConfig.model_validate({"optimizer": optimizer})
    engine = TorchEngine(model=model, config=config)
    before = _rss_bytes()
    started = time.perf_counter()
    result = update(engine, samples, config=config)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"parameters": sum(p.numel() for p in model.parameters()), "tokens": sum(len(s.token_ids) for s in samples),
            "sampled_tokens": sum(sum(s.loss_mask) for s in samples), "tokens_processed": result.tokens_processed,
            "micro_batch_tokens": micro_batch_tokens, "rss_before_gb": round(before / 1e9, 2),
            "peak_rss_gb": round(peak / 1e9, 2), "update_peak_above_before_gb": round((peak - before) / 1e9, 2),
            "update_s": round(seconds, 1), "loss": result.loss}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="A model directory; default: SmolLM2-135M's "
                        "shapes with random weights.")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", choices=sorted(CONFIGURATIONS), help=argparse.SUPPRESS)  # a child's configuration
    args = parser.parse_args(argv)
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model: expected a model directory with config.json, got {args.model}")
    if args.one is not None:
        result = measure(model_dir=args.model, micro_batch_tokens=CONFIGURATIONS[args.one], threads=args.threads)
        sys.stdout.write(json.dumps(result) + "\n")
        return result
    runs = {}
    for name in CONFIGURATIONS:
        command = [sys.executable, __file__, "--one", name, "--threads", str(args.threads)]
        if args.model is not None:
            command += ["--model", str(args.model)]
        done = subprocess.run(command, capture_output=True, text=True, check=True, env={**os.environ,
                              "TOKENIZERS_PARALLELISM": "false"})
        runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
    if runs["sized"]["tokens_processed"] != runs["micro_batch_8192"]["tokens_processed"]:
        raise SystemExit("the two configurations processed different token counts: not the same work")
    out = {"benchmark": "trainer_update_peak_memory",
           "command": "bench/trainer_memory.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "model": str(args.model) if args.model else "SmolLM2-135M shapes, random weights",
           "work": f"one update on {ROLLOUTS} rollouts of {TURNS} turns (~600 tokens each), float32, "
                   f"{args.threads} torch threads", "runs": runs,
           "peak_rss_gb": {name: run["peak_rss_gb"] for name, run in runs.items()}}
    sys.stdout.write(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    main()
