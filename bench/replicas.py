"""Policy pool benchmark: prints ONE JSON object (not a test).

    .venv/bin/python bench/replicas.py [--pairs 5] [--episodes 16] [--turns 4] [--slots 8]

Two real vLLM servers (CPU, the tiny model, float32), each pinned to its own core (`crucible serve
--replicas 2`'s plan), started once; every comparison below runs its two sides on those same servers,
interleaved (ABBA…) in this one process, `--pairs` pairs, the median paired ratio with min and max.

Part 1 — throughput, 1 vs 2 replicas. The same multi-turn episodes (seeded prompts of token ids,
`--turns` turns of up to `--max-tokens` sampled tokens, each turn's prompt the last one plus its
completion plus a seeded "tool output"; requests are not seeded: vLLM 0.32's CPU runner crashes its engine
on a seeded request whose prefill is chunked, "CPU Generator does not use offset") run
`--slots` at a time through the worker's PolicyPool: side "one" has the pool [replica 0], side "two"
[replica 0, replica 1]. Window: the first request to the last episode's end, both sides. Work is
counted: the tokens the servers returned. Target (issue 14): ≥ 1.6×.

Part 2 — prefix affinity vs random routing: time to first token of later turns. Before every turn ≥ 2
a one-token request with the turn's whole prompt is timed (its prefill: what a long agent prompt
costs), then the turn is sampled. Side "affinity": every request of an episode on the replica the pool
leased it (turn k's prompt extends turn k−1's, so that replica holds its prefix in the KV cache); side
"random": each request to a replica drawn at random (seeded). By default one episode at a time
(`--routing-slots 1`), so that a TTFT is the prefill alone: with 8 in flight it is mostly queueing
behind the other episodes' decoding, which swamps what the prefix cache saves (measured once with
`--routing-slots 8 --routing-episodes 16`: 0.75×, 0.70–1.37). Reported: p50/p90 of those TTFTs per side and the paired ratio
of p50s (random ÷ affinity).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pairs import interleave, paired_summary  # noqa: E402
from core.schemas.run import Sampling  # noqa: E402
from task_workers.policy.client import PolicyClient  # noqa: E402
from task_workers.policy.pool import PolicyPool  # noqa: E402
from trainer.replicas import ReplicaPlan, copy_model_dir, replica_plan, start_all, stop_all  # noqa: E402
from trainer.serving import VllmServer  # noqa: E402
from trainer.tiny_model import TinyModelSpec, make_tiny_model  # noqa: E402

SAMPLING = Sampling(temperature=1.0)


def _episode_tokens(seed: int, *, length: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, vocab) for _ in range(length)]


class Workload:
    def __init__(self, *, episodes: int, turns: int, max_tokens: int, prompt_tokens: int, tool_tokens: int,
                 slots: int, vocab: int) -> None:
        self.episodes, self.turns, self.max_tokens, self.slots = episodes, turns, max_tokens, slots
        self.prompts = [_episode_tokens(1000 + e, length=prompt_tokens, vocab=vocab) for e in range(episodes)]
        self.tools = [[_episode_tokens(2000 + 100 * e + t, length=tool_tokens, vocab=vocab) for t in range(turns)]
                      for e in range(episodes)]

    def run(self, episode: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
        started = time.monotonic()
        with ThreadPoolExecutor(self.slots) as pool:
            results = list(pool.map(episode, range(self.episodes)))
        wall = time.monotonic() - started
        tokens = sum(r["tokens"] for r in results)
        ttfts = [t for r in results for t in r["ttft"]]
        out: dict[str, Any] = {"wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": tokens / wall,
                               "episodes": len(results)}
        if ttfts:
            ordered = sorted(ttfts)
            out |= {"ttft_p50_ms": statistics.median(ordered) * 1000,
                    "ttft_p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1000, "ttft_count": len(ordered)}
        return out


def throughput_side(workload: Workload, pool: PolicyPool) -> Callable[[], dict[str, Any]]:
    def episode(e: int) -> dict[str, Any]:
        tokens, prompt = 0, list(workload.prompts[e])
        with pool.episode() as policy:
            for t in range(workload.turns):
                completion = policy.complete(prompt_ids=prompt, max_tokens=workload.max_tokens, sampling=SAMPLING)
                tokens += len(completion.token_ids)
                prompt += completion.token_ids + workload.tools[e][t]
        return {"tokens": tokens, "ttft": []}
    return lambda: workload.run(episode)


def routing_side(workload: Workload, clients: list[PolicyClient], *, affinity: bool,
                 pool: PolicyPool) -> Callable[[], dict[str, Any]]:
    lock = threading.Lock()
    rng = random.Random(7)

    def pick() -> PolicyClient:
        with lock:
            return clients[rng.randrange(len(clients))]

    def episode(e: int) -> dict[str, Any]:
        tokens, prompt, ttft = 0, list(workload.prompts[e]), []
        with pool.episode() as leased:
            for t in range(workload.turns):
                target: Any = leased if affinity else pick()
                if t >= 1:
                    started = time.monotonic()
                    target.complete(prompt_ids=prompt, max_tokens=1, sampling=SAMPLING)
                    ttft.append(time.monotonic() - started)
                target = leased if affinity else pick()
                completion = target.complete(prompt_ids=prompt, max_tokens=workload.max_tokens, sampling=SAMPLING)
                tokens += len(completion.token_ids)
                prompt += completion.token_ids + workload.tools[e][t]
        return {"tokens": tokens, "ttft": ttft}
    return lambda: workload.run(episode)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The benchmark's options: pairs, the two workloads' sizes and the model's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8, help="Episodes in flight at once (worker slots), part 1.")
    parser.add_argument("--routing-slots", type=int, default=1,
                        help="Episodes in flight at once in part 2 (1: each TTFT is the prefill alone).")
    parser.add_argument("--routing-episodes", type=int, default=6, help="Episodes per side in part 2.")
    parser.add_argument("--max-tokens", type=int, default=32, help="Sampled tokens per turn.")
    parser.add_argument("--prompt-tokens", type=int, default=768, help="The first prompt's length.")
    parser.add_argument("--tool-tokens", type=int, default=128, help="Tool output appended after each turn.")
    parser.add_argument("--hidden", type=int, default=512, help="The model's hidden size (heads: hidden / 64).")
    parser.add_argument("--layers", type=int, default=4, help="The model's decoder layers.")
    return parser.parse_args(argv)


def _replica_servers(args: argparse.Namespace, tmp: Path) -> tuple[Path, list[ReplicaPlan], list[VllmServer]]:
    """Write the model under `tmp` and plan two vLLM servers on it, one core each (not started yet)."""
    # Larger than the tests' tiny model, so that each replica's time goes to the model, not to HTTP.
    spec = TinyModelSpec(hidden=args.hidden, layers=args.layers, heads=args.hidden // 64,
                         kv_heads=max(1, args.hidden // 128), intermediate=2 * args.hidden)
    model = make_tiny_model(out_dir=tmp / "model", seed=0, spec=spec).path
    plans = replica_plan(model_dir=model, replicas=2, port=0, cores=sorted(os.sched_getaffinity(0))[:2])
    servers = []
    for plan in plans:
        copy_model_dir(model, plan.model_dir)
        servers.append(VllmServer(model_dir=plan.model_dir, port=plan.port, served_model_name="tiny",
                                  max_model_len=4096, cpus=plan.cpus,
                                  log_path=Path(tempfile.gettempdir()) / f"crucible-bench-replica-{plan.index}.log",
                                  startup_timeout_s=600))
    return model, plans, servers


def _compare_sides(args: argparse.Namespace, workload: Workload,
                   urls: list[str]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """Run both parts' interleaved pairs on the started servers: (throughput runs, routing runs)."""
    def client(url: str) -> PolicyClient:
        return PolicyClient(base_url=url, retries=1, backoff_s=0.1)

    one, two = PolicyPool(urls[:1], client_factory=client), PolicyPool(urls, client_factory=client)
    clients = [client(url) for url in urls]
    throughput_side(workload, two)()  # warm-up (not reported): both servers, every code path
    throughput = interleave(pairs=args.pairs, sides={"two": throughput_side(workload, two),
                                                     "one": throughput_side(workload, one)})
    sequential = copy.copy(workload)
    sequential.slots, sequential.episodes = args.routing_slots, min(args.routing_episodes, args.episodes)
    routing = interleave(pairs=args.pairs, sides={
        "random": routing_side(sequential, clients, affinity=False, pool=two),
        "affinity": routing_side(sequential, clients, affinity=True, pool=two)})
    for pool in (one, two):
        pool.close()
    for c in clients:
        c.close()
    return throughput, routing


def _report(args: argparse.Namespace, *, plans: list[ReplicaPlan], throughput: dict[str, list[dict[str, Any]]],
            routing: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The one JSON object: the servers, the workload, and each part's paired ratios."""
    speed = paired_summary(throughput["two"], throughput["one"], key="tokens_per_s")
    ttft = paired_summary(routing["random"], routing["affinity"], key="ttft_p50_ms")
    return {
        "servers": {"replicas": 2, "cores": [list(p.cpus) for p in plans],
                    "model": f"Qwen2, hidden {args.hidden}, {args.layers} layers (float32, eager)",
                    "max_model_len": 4096},
        "workload": {k: v for k, v in vars(args).items() if k != "pairs"},
        "window": "first request to the last episode's end, the same on both sides; tokens counted from responses",
        "throughput": {
            "metric": "tokens/s with 2 replicas ÷ with 1 (the same episodes), per pair",
            "median": speed["ratio_median"], "min": speed["ratio_min"], "max": speed["ratio_max"],
            "per_pair": speed["ratios"], "pairs": speed["pairs"],
            "p50_tokens_per_s": {"two": round(speed["a_p50"], 1), "one": round(speed["b_p50"], 1)},
            "tokens": {"two": [r["tokens"] for r in throughput["two"]], "one": [r["tokens"] for r in throughput["one"]]},
            "target": 1.6,
        },
        "routing": {
            "metric": "p50 time to first token of turns ≥ 2 (a one-token request with the turn's whole prompt): "
                      "random routing ÷ prefix affinity, per pair",
            "median": ttft["ratio_median"], "min": ttft["ratio_min"], "max": ttft["ratio_max"],
            "per_pair": ttft["ratios"], "pairs": ttft["pairs"],
            "ttft_ms": {side: {"p50": round(statistics.median(r["ttft_p50_ms"] for r in routing[side]), 2),
                               "p90": round(statistics.median(r["ttft_p90_ms"] for r in routing[side]), 2)}
                        for side in ("affinity", "random")},
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="crucible-bench-replicas-") as tmp:
        model, plans, servers = _replica_servers(args, Path(tmp))
        start_all(servers)
        try:
            urls = [server.api_url for server in servers]
            from transformers import AutoTokenizer

            vocab = len(AutoTokenizer.from_pretrained(model))
            workload = Workload(episodes=args.episodes, turns=args.turns, max_tokens=args.max_tokens,
                                prompt_tokens=args.prompt_tokens, tool_tokens=args.tool_tokens, slots=args.slots,
                                vocab=vocab)
            throughput, routing = _compare_sides(args, workload, urls)
        finally:
            stop_all(servers)
    return _report(args, plans=plans, throughput=throughput, routing=routing)


if __name__ == "__main__":
    with contextlib.redirect_stdout(sys.stderr):  # stdout is for the one JSON object (libraries print there)
        result = main()
    print(json.dumps(result, indent=2))
