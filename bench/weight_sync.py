"""Measure the policy-serving loop on this machine: vLLM start-up, generation tokens/s, sync seconds, probe.

    .venv/bin/python bench/weight_sync.py [--pushes 10] [--json]

Makes a tiny model in a temp dir, serves it (one vLLM server, stopped at the end), times batched
generation, then pushes perturbed weights `--pushes` times, verifying each push with the probe.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.versions import Label
from trainer.probe import probe, probe_token_ids, verify_sync
from trainer.serving import VllmServer
from trainer.tiny_model import make_tiny_model
from trainer.weight_sync import make_weight_syncer


def generation_tokens_per_s(server: VllmServer, *, prompts: int, tokens: int) -> float:
    body = {"model": server.model_name, "prompt": [[1, 200, 300, 400]] * prompts, "max_tokens": tokens,
            "ignore_eos": True, "temperature": 1.0, "logprobs": 0, "return_token_ids": True}
    started = time.perf_counter()
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=300)
    response.raise_for_status()
    return prompts * tokens / (time.perf_counter() - started)


def run(*, pushes: int) -> dict[str, object]:
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        info = make_tiny_model(out_dir=Path(tmp) / "model", seed=0)
        results.update(parameters=info.parameters, vocab=info.vocab_size, weight_mb=info.weight_bytes / 1e6)
        model = AutoModelForCausalLM.from_pretrained(info.path).eval()
        ids = probe_token_ids(AutoTokenizer.from_pretrained(info.path))
        started = time.perf_counter()
        with VllmServer(model_dir=info.path, served_model_name="tiny", max_model_len=1024) as server:
            results["startup_s"] = round(time.perf_counter() - started, 1)
            generation_tokens_per_s(server, prompts=2, tokens=8)  # warm-up
            for prompts, tokens in ((1, 256), (16, 32), (64, 128)):
                results[f"tok_per_s_{prompts}x{tokens}"] = round(generation_tokens_per_s(
                    server, prompts=prompts, tokens=tokens))
            on_server = {"api_url": server.api_url, "model_name": server.model_name}
            results["probe_mean_abs_diff_start"] = probe(model=model, token_ids=ids, **on_server).mean_abs_diff
            syncer = make_weight_syncer("reload", base_url=server.base_url, model_dir=server.model_dir)
            seconds, before, after = [], [], []
            current = copy.deepcopy(model)
            for version in range(1, pushes + 1):
                with torch.no_grad():  # a stand-in for an optimizer step
                    for param in current.parameters():
                        param.add_(torch.randn_like(param) * 0.01)
                before.append(probe(model=current, token_ids=ids, **on_server).mean_abs_diff)
                seconds.append(syncer.push(model=current, label=Label.fresh(version, run=None)))
                after.append(verify_sync(model=current, token_ids=ids, api_url=server.api_url,
                                         model_name=server.model_name).mean_abs_diff)
            syncer.close()
        results.update(
            sync_s_median=round(statistics.median(seconds), 4), sync_s_max=round(max(seconds), 4),
            probe_mean_abs_diff_before_push=statistics.mean(before),
            probe_mean_abs_diff_after_push_max=max(after), probe_tokens=len(ids) - 1,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    results = run(pushes=args.pushes)
    console = Console()
    if args.json:
        console.print_json(json.dumps(results))
    else:
        for key, value in results.items():
            console.print(f"{key:36} {value:.3g}" if isinstance(value, float) else f"{key:36} {value}")


if __name__ == "__main__":
    main()
