"""Benchmark the trainer on this machine; prints ONE JSON object.

    .venv/bin/python bench/trainer.py [--steps 6] [--prompts 4] [--group 4] [--prompt-len 192] [--completion-len 64]

1. Update throughput, ours vs TRL's GRPOTrainer, measured in the same run on the same tiny model,
   batch (prompts × group sequences) and lengths (prompt + completion tokens), both DAPO loss, β=0,
   one optimizer step per batch, plain PyTorch on CPU. TRL generates inside its training step, so
   its update time is its training wall-clock minus the time inside `_generate_and_score_completions`;
   ours is `trainer.step.update`. tokens/s = (prompt + completion) tokens through forward and backward.
   Both with `--threads` torch threads (default 1: two threads thrash on a shared 2-core machine),
   alternating `--repeats` times; medians.
2. Weight sync: push + probe of the tiny model into a real vLLM (CPU) server, seconds per sync.
3. Async vs sync wall-clock to the same number of updates: rollouts sampled from that vLLM server
   (completions API, token ids + logprobs), updates with our engine, a verified sync after each.
   sync: sample → update → sync, in turn; async (staleness 1): the next batch is sampled while the
   current one trains. By default vLLM gets one CPU and the trainer the other (`--no-pin`: shared).

Needs `trl` (`pip install trl`, dev extra).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.advantages import assign_advantages
from trainer.config import TrainerConfig
from trainer.engine import TorchEngine
from trainer.probe import probe_token_ids
from trainer.rollouts import Group, Sample
from trainer.serving import VllmServer
from trainer.step import update
from trainer.sync import PolicyServer, Publisher
from trainer.tiny_model import make_tiny_model
from trainer.weight_sync import make_weight_syncer

CONFIG = {"optimizer": {"lr": 1e-5, "micro_batch_tokens": 1 << 16}}  # one micro-batch, like TRL's batch


def _samples(rng: random.Random, *, prompts: int, group: int, prompt_len: int, completion_len: int,
             vocab: int) -> list[Sample]:
    samples, episode = [], 0
    for g in range(prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        members = []
        for _ in range(group):
            completion = [rng.randrange(3, vocab) for _ in range(completion_len)]
            members.append(Sample(
                episode_id=episode, group_id=g, environment="bench", status="completed", termination="submitted",
                reward=rng.random(), components={}, policy_version=0, token_ids=prompt + completion,
                loss_mask=[0] * prompt_len + [1] * completion_len,
                behaviour_logprobs=[0.0] * prompt_len + [-7.6] * completion_len))
            episode += 1
        for s in members:
            s.score = s.reward
        assign_advantages([Group(id=g, group_index=g, environment="bench", policy_version=0, samples=members)],
                          scale_by_std=False)
        samples += members
    return samples


def ours_tokens_per_s(model_dir: Path, *, steps: int, **shape: int) -> dict[str, float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = TrainerConfig.model_validate(CONFIG)
    engine = TorchEngine(model=model, config=config)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    update(engine, _samples(rng, vocab=vocab, **shape), config=config)  # warm-up
    tokens, seconds = 0, 0.0
    for _ in range(steps):
        result = update(engine, _samples(rng, vocab=vocab, **shape), config=config)
        tokens, seconds = tokens + result.tokens_processed, seconds + result.seconds
    return {"tokens_per_s": tokens / seconds, "seconds_per_step": seconds / steps}


def trl_tokens_per_s(model_dir: Path, *, steps: int, prompts: int, group: int, prompt_len: int,
                     completion_len: int) -> dict[str, float]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # " the" is one token and stays one when repeated: every prompt is exactly prompt_len tokens.
    rows = [{"prompt": " the" * prompt_len} for _ in range(prompts * (steps + 1))]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_cpu=True, bf16=False, report_to=[],
        per_device_train_batch_size=prompts * group, num_generations=group, max_completion_length=completion_len,
        generation_kwargs={"min_new_tokens": completion_len}, loss_type="dapo", beta=0.0, epsilon=0.2,
        epsilon_high=0.28, scale_rewards="none", learning_rate=1e-5, max_steps=steps + 1, logging_steps=10**6,
        save_strategy="no", dataloader_num_workers=0, gradient_accumulation_steps=1, seed=0, max_grad_norm=1.0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **_: [random.random()
                                                                                   for _ in completions],
                          args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    timing: dict[str, Any] = {"generation": [], "tokens": [], "steps": []}
    generate = trainer._generate_and_score_completions
    step = trainer.training_step

    def timed_generate(inputs: Any) -> Any:
        started = time.perf_counter()
        out = generate(inputs)
        timing["generation"].append(time.perf_counter() - started)
        timing["tokens"].append(int(out["prompt_mask"].sum() + out["completion_mask"].sum()))
        return out

    def timed_step(*a: Any, **k: Any) -> Any:
        timing["steps"].append(time.perf_counter())
        return step(*a, **k)

    trainer._generate_and_score_completions = timed_generate  # type: ignore[method-assign]
    trainer.training_step = timed_step  # type: ignore[method-assign]
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs: stdout is for the one JSON
        trainer.train()
    total = time.perf_counter() - started
    # Leave out the first step (warm-up): time from the second step's start to the end.
    warm = timing["steps"][1] - started
    update_s = (total - warm) - sum(timing["generation"][1:])
    tokens = sum(timing["tokens"][1:])
    return {"tokens_per_s": tokens / update_s, "seconds_per_step": update_s / steps,
            "generation_s_per_step": statistics.fmean(timing["generation"][1:])}


def _rollouts(server: VllmServer, *, prompts: list[list[int]], group: int, completion_len: int,
              rng: random.Random) -> list[Sample]:
    """One batch sampled by vLLM: every prompt `group` times, token ids and behaviour logprobs."""
    body = {"model": server.model_name, "prompt": prompts, "n": group, "max_tokens": completion_len,
            "ignore_eos": True, "temperature": 1.0, "logprobs": 0, "return_token_ids": True}
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=300)
    response.raise_for_status()
    samples = []
    for index, choice in enumerate(response.json()["choices"]):
        prompt = prompts[choice["index"] // group] if "index" in choice else prompts[index // group]
        ids, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        samples.append(Sample(
            episode_id=index, group_id=index // group, environment="bench", status="completed",
            termination="submitted", reward=rng.random(), components={}, policy_version=0,
            token_ids=prompt + ids, loss_mask=[0] * len(prompt) + [1] * len(ids),
            behaviour_logprobs=[0.0] * len(prompt) + logprobs))
    groups = [Group(id=g, group_index=g, environment="bench", policy_version=0, samples=samples[g * group:(g + 1) *
                                                                                                  group])
              for g in range(len(prompts))]
    for s in samples:
        s.score = s.reward
    assign_advantages(groups, scale_by_std=False)
    return samples


def pipeline_seconds(server: VllmServer, publisher: Publisher, model_dir: Path, *, mode: str, updates: int,
                     prompts: int, group: int, prompt_len: int, completion_len: int) -> float:
    """Wall-clock of `updates` sample → update → verified-sync rounds; async overlaps the next sampling."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = TrainerConfig.model_validate(CONFIG)
    engine = TorchEngine(model=model, config=config)
    rng = random.Random(1)
    batches = [[[rng.randrange(3, 2000) for _ in range(prompt_len)] for _ in range(prompts)] for _ in range(updates)]
    publisher.push(engine=engine, version=0)
    started = time.perf_counter()
    if mode == "sync":
        for version, batch in enumerate(batches, start=1):
            samples = _rollouts(server, prompts=batch, group=group, completion_len=completion_len, rng=rng)
            update(engine, samples, config=config)
            publisher.push(engine=engine, version=version)
        return time.perf_counter() - started
    ready: list[list[Sample]] = []
    lock = threading.Condition()

    def sample_ahead() -> None:  # staleness 1: batch k+1 is sampled while batch k trains
        for batch in batches:
            samples = _rollouts(server, prompts=batch, group=group, completion_len=completion_len, rng=rng)
            with lock:
                while len(ready) >= 1:
                    lock.wait()
                ready.append(samples)
                lock.notify_all()

    thread = threading.Thread(target=sample_ahead, daemon=True)
    thread.start()
    for version in range(1, updates + 1):
        with lock:
            while not ready:
                lock.wait()
            samples = ready.pop(0)
            lock.notify_all()
        update(engine, samples, config=config)
        publisher.push(engine=engine, version=version)
    thread.join()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="Measured updates per trainer (after one warm-up).")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=192)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--syncs", type=int, default=8)
    parser.add_argument("--pipeline-updates", type=int, default=6)
    parser.add_argument("--pipeline-prompts", type=int, default=8)
    parser.add_argument("--pipeline-group", type=int, default=8)
    parser.add_argument("--pipeline-completion-len", type=int, default=128)
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="Do not give vLLM and the trainer a CPU each in the async/sync comparison.")
    parser.add_argument("--repeats", type=int, default=3, help="Alternating ours/TRL measurements; medians.")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for both trainers (on 2 shared cores, 2 threads thrash: 5-10x slower).")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    shape = {"prompts": args.prompts, "group": args.group, "prompt_len": args.prompt_len,
             "completion_len": args.completion_len}
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
                           "shape": shape}
    with tempfile.TemporaryDirectory() as tmp:
        info = make_tiny_model(out_dir=Path(tmp) / "model", seed=0)
        out["model"] = {"parameters": info.parameters, "vocab": info.vocab_size}
        out["update"] = _update_throughput(info.path, args=args, shape=shape)
        out.update(_served(info.path, Path(tmp), args=args, shape=shape))
    sys.stdout.write(json.dumps(out, default=lambda v: round(v, 4) if isinstance(v, float) else str(v)) + "\n")


def _update_throughput(model_dir: Path, *, args: argparse.Namespace, shape: dict[str, int]) -> dict[str, Any]:
    """Ours and TRL's, alternating (the machine's other load drifts), medians of `repeats` each."""
    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(ours_tokens_per_s(model_dir, steps=args.steps, **shape))
        theirs.append(trl_tokens_per_s(model_dir, steps=args.steps, **shape))
    ours_median = statistics.median(r["tokens_per_s"] for r in ours)
    trl_median = statistics.median(r["tokens_per_s"] for r in theirs)
    return {"ours_tokens_per_s": ours_median, "trl_grpo_tokens_per_s": trl_median,
            "speedup_vs_trl": round(ours_median / trl_median, 2),
            "ours_runs": [r["tokens_per_s"] for r in ours], "trl_runs": [r["tokens_per_s"] for r in theirs],
            "trl_generation_s_per_step": statistics.median(r["generation_s_per_step"] for r in theirs)}


def _served(model_dir: Path, tmp: Path, *, args: argparse.Namespace, shape: dict[str, int]) -> dict[str, Any]:
    import shutil

    served = Path(shutil.copytree(model_dir, tmp / "served"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cpus = sorted(os.sched_getaffinity(0))
    placement = "shared"
    if args.pin and len(cpus) >= 2:  # vLLM's OpenMP threads on the first CPU, this process on the second
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus[0])
        placement = f"vLLM on CPU {cpus[0]}, trainer on CPU {cpus[1]}"
    with VllmServer(model_dir=served, served_model_name="tiny", max_model_len=1024) as server:
        if placement != "shared":
            os.sched_setaffinity(0, {cpus[1]})  # after the start: the server must not inherit it
        policy = PolicyServer(api_url=server.api_url, base_url=server.base_url, model_name=server.model_name,
                              model_dir=served)
        publisher = Publisher(server=policy, syncer=make_weight_syncer("reload", base_url=server.base_url,
                                                                       model_dir=served),
                              probe_ids=probe_token_ids(tokenizer))
        engine = TorchEngine(model=AutoModelForCausalLM.from_pretrained(model_dir),
                             config=TrainerConfig.model_validate(CONFIG))
        push, total = [], []
        for version in range(args.syncs):
            started = time.perf_counter()
            report = publisher.push(engine=engine, version=version)
            push.append(report.seconds)
            total.append(time.perf_counter() - started)
        sync = {"push_s_median": statistics.median(push), "push_and_probe_s_median": statistics.median(total),
                "probe_mean_abs_diff": report.probe.mean_abs_diff, "syncs": args.syncs}
        pipeline = {"prompts": args.pipeline_prompts, "group": args.pipeline_group, "prompt_len": shape["prompt_len"],
                    "completion_len": args.pipeline_completion_len}
        seconds = {mode: pipeline_seconds(server, publisher, model_dir, mode=mode, updates=args.pipeline_updates,
                                          **pipeline) for mode in ("sync", "async")}
        publisher.close()
    return {"weight_sync": sync, "async_vs_sync": {
        "updates": args.pipeline_updates, "sync_s": seconds["sync"], "async_s": seconds["async"],
        "speedup": round(seconds["sync"] / seconds["async"], 2), "placement": placement, "shape": pipeline}}


if __name__ == "__main__":
    main()
