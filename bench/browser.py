"""Browser sandbox benchmark: prints ONE JSON object (not a test). Run: `.venv/bin/python bench/browser.py`.

On this machine's dockerd, with the `browser` image (Debian's Chromium driven over CDP on a pipe):
  * step latency p50/p99: one action and the new observation (accessibility tree with bids), as the
    worker sees it (host round trip through the sandbox's attached stream), over `--steps` actions on
    MiniWoB++ pages (click, fill, hover, press, noop); with a screenshot too, separately;
  * reset vs relaunch, interleaved pairs (ABAB…, `--pairs`, default 10): `open` of the next task as the
    next episode waits for it (its browser context was prepared while the last episode ran) against
    `relaunch` (Chromium killed and started again, a new context, the page loaded: what BrowserGym's
    reset does). Between two measurements each side plays the same short episode: 3 actions, each
    after `--think-ms` (250) of policy time — a tiny model's turn on CPU takes longer, a large model's
    on a GPU about that — so the prepared side gets only the time a short real episode gives it.
    Ratio = relaunch / reset per pair;
  * isolation after the resets: a page wrote a cookie, localStorage, sessionStorage and IndexedDB
    before a reset and the next episode finds none of them;
  * episodes per minute on this machine: scripted MiniWoB++ episodes (open, the solving actions, the
    page's reward read back), counted over a fixed window with `--sandboxes` sandboxes in parallel;
  * memory of one browser sandbox (its cgroup's usage) after the runs.
Targets (2 cores): step p50 <= 100 ms (BrowserGym: 724 ms); reset >= 5x faster than a relaunch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pairs import interleave, paired_summary
from environments.images import build_images
from sandboxes import SandboxSpec, create_sandbox, make_backend
from sandboxes.docker_client import docker_api

TASKS = ("click-checkboxes", "enter-text", "login-user", "click-option", "click-tab", "click-button")
SPEC_LIMITS = {"memory": "2g", "pids": 1024, "max_lifetime_s": 1800}


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {"p50": round(statistics.median(ms), 2), "p99": round(p99, 2), "n": len(ms)}


def miniwob(name: str, seed: int) -> dict[str, Any]:
    return {"family": "miniwob", "name": name, "seed": seed, "navigation": False}


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def actions_for(page: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Actions that keep the task open (none submits): clicks on options/checkboxes, fills, hovers."""
    import re

    tree = page["tree"]
    out: list[tuple[str, dict[str, Any]]] = []
    for bid in re.findall(r"\[(\d+)\] (?:checkbox|radio) ", tree):
        out.append(("click", {"bid": bid}))
    for bid in re.findall(r"\[(\d+)\] textbox ", tree):
        out += [("fill", {"bid": bid, "text": "hello"}), ("press", {"bid": bid, "key": "a"})]
    for bid in re.findall(r"\[(\d+)\] (?:button|link) ", tree):
        out.append(("hover", {"bid": bid}))
    return [*out, ("noop", {})]


def step_latency(session: Any, *, steps: int, screenshot: bool) -> list[float]:
    samples: list[float] = []
    seed = 1000
    while len(samples) < steps:
        for name in TASKS:
            page = session.call("open", task=miniwob(name, seed))
            seed += 1
            for action, args in actions_for(page):
                seconds, reply = timed(lambda a=action, g=args: session.call("act", action=a, args=g,
                                                                             screenshot=screenshot))
                if reply.get("error"):
                    raise RuntimeError(f"{action} {args}: {reply['error']}")
                samples.append(seconds)
                if len(samples) >= steps:
                    return samples
    return samples


THINK_S = 0.25


def short_episode(session: Any, page: dict[str, Any]) -> None:
    for action, args in actions_for(page)[:3]:
        time.sleep(THINK_S)  # the policy's turn
        session.call("act", action=action, args=args)


def reset_vs_relaunch(session: Any, *, pairs: int) -> dict[str, Any]:
    counter = {"seed": 5000}

    def next_task() -> dict[str, Any]:
        counter["seed"] += 1
        return miniwob(TASKS[counter["seed"] % len(TASKS)], counter["seed"])

    def reset() -> dict[str, Any]:
        seconds, page = timed(lambda: session.call("open", task=next_task()))
        short_episode(session, page)
        return {"seconds": seconds, "driver_open_s": page["timings"]["open"]}

    def relaunch() -> dict[str, Any]:
        seconds, reply = timed(lambda: session.call("relaunch", task=next_task()))
        short_episode(session, session.call("observe"))
        return {"seconds": seconds, "launch_s": reply["timings"]["launch"]}

    session.call("open", task=next_task())  # a prepared context exists from here on, as in a run
    runs = interleave(pairs=pairs, sides={"relaunch": relaunch, "reset": reset})
    paired = paired_summary(runs["relaunch"], runs["reset"], key="seconds")
    return {
        "reset_ms": summary([r["seconds"] for r in runs["reset"]]),
        "relaunch_ms": summary([r["seconds"] for r in runs["relaunch"]]),
        "relaunch_over_reset": {k: paired[k] for k in ("ratio_median", "ratio_min", "ratio_max", "pairs")},
        "ratios": paired["ratios"], "episode_between": f"3 actions, {THINK_S * 1000:g} ms of policy time before each",
    }


ISOLATION_WRITE = """(async () => {
  document.cookie = 'crucible_probe=1; max-age=3600';
  localStorage.setItem('probe', '1'); sessionStorage.setItem('probe', '1');
  await new Promise((ok, bad) => { const r = indexedDB.open('probe', 1);
    r.onupgradeneeded = () => r.result.createObjectStore('s'); r.onsuccess = () => { r.result.close(); ok(); };
    r.onerror = bad; });
  return true;
})()"""
ISOLATION_READ = """(async () => ({cookie: document.cookie, local: localStorage.length, session: sessionStorage.length,
  idb: (await indexedDB.databases()).length}))()"""


def isolation(session: Any) -> dict[str, Any]:
    session.call("open", task=miniwob("click-button", 1))
    session.call("eval", expression=ISOLATION_WRITE)
    before = session.call("eval", expression=ISOLATION_READ)["value"]
    session.call("open", task=miniwob("click-button", 1))  # the same origin path, a new episode
    after = session.call("eval", expression=ISOLATION_READ)["value"]
    clean = after == {"cookie": "", "local": 0, "session": 0, "idb": 0}
    return {"ok": clean and before["local"] == 1 and before["idb"] == 1, "before": before, "after": after}


def episodes_per_minute(sandboxes: list[Any], *, window_s: float) -> dict[str, Any]:
    from environments.browser.solver import SOLVERS as PLANS

    done: list[float] = []
    rewards: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + window_s
    names = sorted(PLANS)

    def play(sb: Any, offset: int) -> None:
        session = sb.browser()
        index = offset
        while time.monotonic() < deadline:
            name = names[index % len(names)]
            index += len(sandboxes)
            page = session.call("open", task=miniwob(name, 10_000 + index))
            for call in PLANS[name](page["goal"], page["tree"]):
                body = json.loads(call.split("<tool_call>")[1].split("</tool_call>")[0])
                reply = session.call("act", action=body["name"], args=body["arguments"])
                if reply.get("done"):
                    break
            state = session.call("state")
            if time.monotonic() <= deadline:
                with lock:
                    done.append(time.monotonic())
                    rewards.append(float(state.get("raw_reward", 0.0)) if state.get("done") else 0.0)

    threads = [threading.Thread(target=play, args=(sb, i)) for i, sb in enumerate(sandboxes)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = min(time.monotonic(), deadline) - started
    return {"episodes": len(done), "window_s": round(elapsed, 1),
            "per_minute": round(len(done) / elapsed * 60, 1), "sandboxes": len(sandboxes),
            "mean_reward": round(statistics.mean(rewards), 3) if rewards else None}


def memory_mb(container_id: str) -> float | None:
    stats = docker_api().stats(container_id, stream=False)
    usage = stats.get("memory_stats", {}).get("usage")
    return round(usage / 2**20, 1) if usage else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of scripted episodes")
    parser.add_argument("--sandboxes", type=int, default=2)
    parser.add_argument("--think-ms", type=float, default=250.0, help="policy time before each action of the "
                        "episodes between resets")
    args = parser.parse_args()
    global THINK_S
    THINK_S = args.think_ms / 1000
    image = {b.name: b.tag for b in build_images(names=["browser"])}["browser"]
    backend = make_backend()
    spec = SandboxSpec(image=image, **SPEC_LIMITS)
    made = [create_sandbox(backend=backend, spec=spec) for _ in range(max(1, args.sandboxes))]
    try:
        session = made[0].browser()
        info = dict(session.info)
        out: dict[str, Any] = {"bench": "browser", "chromium": info.get("chromium"), "tasks": list(TASKS),
                               "targets": {"step_p50_ms": 100, "relaunch_over_reset": 5.0}}
        out["step_ms"] = summary(step_latency(session, steps=args.steps, screenshot=False))
        out["step_with_screenshot_ms"] = summary(step_latency(session, steps=max(20, args.steps // 4),
                                                              screenshot=True))
        out["reset"] = reset_vs_relaunch(session, pairs=args.pairs)
        out["isolation"] = isolation(session)
        for sb in made[1:]:
            sb.browser()
        out["episodes"] = episodes_per_minute(made, window_s=args.window)
        out["sandbox_memory_mb"] = memory_mb(made[0].container_id)
        out["window"] = ("step: host round trip of one `act` (action, settle, new tree); reset: host round trip "
                         "of `open` (the next episode's first page); relaunch: host round trip of `relaunch` "
                         "(kill, launch, new context, the page)")
    finally:
        for sb in made:
            sb.destroy(reason="bench done")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
