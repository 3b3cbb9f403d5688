"""Benchmark the API and dashboard on a store of ten million turns: every dashboard page and the JSON it
reads (run page data, filtered and searched episode lists, a group, an episode, a turn's tokens), p50/p95
over repeated requests through a uvicorn server on loopback (target: p95 < 300 ms each); then a finished
run is archived to Parquet (`crucible runs archive`), its pages measured again as they read the archive,
and restored — archive and restore timed and reported per million turns.

    .venv/bin/python bench/api.py                       # seeds its own database once, then measures
    .venv/bin/python bench/api.py --turns 100000 --repeat 10

The database `crucible_bench_api_<turns>` is created on CRUCIBLE_BENCH_DATABASE_URL (else
CRUCIBLE_TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres) and seeded with
scripts/seed_store.py unless it already holds that store; it is kept for the next run. Prints ONE
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy.engine import make_url

from core.net import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.seed_store import StoreShape, scalar, seed  # noqa: E402

TARGET_MS = 300.0
PAGE_LOAD = "dashboard /runs/{id} loaded (HTML, then run + metrics + stats at once, as run.js)"
DEFAULT_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _dsn(url: str, database: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    return (parsed.set(database=database) if database else parsed).render_as_string(hide_password=False)


def prepare_store(turns: int) -> tuple[str, dict[str, Any]]:
    """The bench database URL, seeded with `turns` turns (reused when it already is)."""
    admin = os.environ.get("CRUCIBLE_BENCH_DATABASE_URL") or os.environ.get("CRUCIBLE_TEST_DATABASE_URL") or DEFAULT_ADMIN
    name = f"crucible_bench_api_{turns}"
    url = _dsn(admin, name)
    with psycopg.connect(_dsn(admin), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None
    if exists:
        _restore_leftovers(url)
        with psycopg.connect(url) as conn:
            held = scalar(conn, "SELECT count(*) FROM turns")
        if held == turns:
            from scripts.seed_store import backfill_points

            return url, {"seeded_now": False, "turns": held, "points_filled_now": backfill_points(url)}
        with psycopg.connect(_dsn(admin), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    from migrations import migrate

    with psycopg.connect(_dsn(admin), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    migrate.upgrade("head", url=make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False))
    return url, {"seeded_now": True, **seed(url, StoreShape(turns=turns), log=False)}


def _engine(url: str) -> Any:
    from sqlalchemy import create_engine, pool

    return create_engine(make_url(url).set(drivername="postgresql+psycopg"), poolclass=pool.NullPool)


def _restore_leftovers(url: str) -> None:
    """A bench run stopped between archive and restore left a run archived: bring its turns back."""
    from core.archive import restore_run

    with psycopg.connect(url) as conn:
        archived = [row[0] for row in conn.execute("SELECT id FROM runs WHERE archive_path IS NOT NULL")]
    engine = _engine(url)
    try:
        for run_id in archived:
            restore_run(engine, run_id)
    finally:
        engine.dispose()


def serve(url: str) -> tuple[str, Any]:
    """The API on a loopback port in this process, pointed at `url`, configured (and started) as `crucible api`
    does; returns its base URL and server."""
    import uvicorn

    os.environ["CRUCIBLE_DATABASE_URL"] = url
    os.environ["CRUCIBLE_LOG_LEVEL"] = "WARNING"  # no access log line per request
    from core.settings import get_settings

    get_settings.cache_clear()
    from api.main import create_app
    from api.server import uvicorn_config

    port = free_port()
    server = uvicorn.Server(uvicorn_config(host="127.0.0.1", port=port, app=create_app()))  # as `crucible api`
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def _token() -> str:
    from api.services.tokens import create_token
    from core.db import session_scope

    with session_scope() as session:
        return create_token(session, name="bench")[1]


def _running_run(http: httpx.Client) -> int:
    return int(http.get("/v1/runs", params={"status": "running", "limit": 1}).json()["data"][0]["id"])


def _targets(http: httpx.Client, run: int) -> dict[str, str]:
    """The requests to time: the running run's pages, the JSON they read, and episode lists over it."""
    episodes = http.get("/v1/episodes", params={"run_id": run, "status": "completed", "limit": 1}).json()["data"]
    episode, group = episodes[0]["id"], episodes[0]["group_id"]
    second_page = http.get("/v1/episodes", params={"run_id": run, "limit": 50}).json()["next_cursor"]
    environment = http.get(f"/v1/runs/{run}").json()["environments"][-1]["name"]
    return {
        "run show (summary counts)": f"/v1/runs/{run}",
        "run metrics (steps + per-step aggregates)": f"/v1/runs/{run}/metrics",
        "run stats (staleness, throughput, time split)": f"/v1/runs/{run}/stats",
        "run groups (latest 12)": f"/v1/runs/{run}/groups?limit=12",
        "run episodes (latest 12)": f"/v1/episodes?run_id={run}&limit=12",
        "episodes: run + termination + reward range": f"/v1/episodes?run_id={run}&termination_reason=max_turns"
                                                      "&min_reward=0&max_reward=0.5&limit=50",
        "episodes: environment + status + version": f"/v1/episodes?environment={environment}&status=completed&policy_version=3",
        "episodes: second page by cursor": f"/v1/episodes?run_id={run}&limit=50&cursor={second_page}",
        "episodes: search rare word in turns": f"/v1/episodes?run_id={run}&q=segfault&limit=50",
        "episodes: search common phrase in turns": f'/v1/episodes?run_id={run}&q="edit calc.py"&limit=50',
        "episodes: search, no run filter": "/v1/episodes?q=traceback%20-timed&limit=50",
        "group show (G rollouts + advantages)": f"/v1/groups/{group}",
        "episode show (turns, no tokens)": f"/v1/episodes/{episode}",
        "turn tokens": f"/v1/episodes/{episode}/turns/0/tokens",
        **_pages(run=run, group=group, episode=episode),
    }


def _pages(*, run: int, group: int, episode: int) -> dict[str, str]:
    """Every dashboard page (HTML; the run page's charts' data is the JSON `run_page_load` fetches)."""
    return {
        "dashboard / (runs)": "/",
        "dashboard /runs/{id} (HTML: summary, latest groups and episodes)": f"/runs/{run}",
        "dashboard /groups/{id}": f"/groups/{group}",
        "dashboard /episodes?run_id (filtered list)": f"/episodes?run_id={run}&status=completed",
        "dashboard /episodes?q (search in turns)": f"/episodes?run_id={run}&q=segfault",
        "dashboard /episodes/{id}": f"/episodes/{episode}",
    }


def _archived_targets(http: httpx.Client, run: int) -> dict[str, str]:
    """The requests that read an archived run's turns (from Parquet), and its run page."""
    episodes = http.get("/v1/episodes", params={"run_id": run, "status": "completed", "limit": 1}).json()["data"]
    episode, group = episodes[0]["id"], episodes[0]["group_id"]
    return {
        "archived: group show": f"/v1/groups/{group}",
        "archived: episode show (turns, no tokens)": f"/v1/episodes/{episode}",
        "archived: episode show with tokens": f"/v1/episodes/{episode}?tokens=true",
        "archived: turn tokens": f"/v1/episodes/{episode}/turns/0/tokens",
        **{name.replace("dashboard", "archived: dashboard"): path
           for name, path in _pages(run=run, group=group, episode=episode).items()
           if "q (search" not in name and name != "dashboard / (runs)"},
    }


def _per_million(seconds: float, turns: int) -> float:
    return round(seconds / turns * 1_000_000, 1)


def archive_round_trip(url: str, http: httpx.Client, *, repeat: int) -> dict[str, Any]:
    """Archive the latest completed run, time its pages as they read the archive, restore it."""
    from core.archive import archive_run, restore_run

    run = http.get("/v1/runs", params={"status": "completed", "limit": 1}).json()["data"][0]["id"]
    engine = _engine(url)
    try:
        archived = archive_run(engine, run)
        requests = {name: measure(http, path, repeat=repeat) for name, path in _archived_targets(http, run).items()}
        requests[f"archived: {PAGE_LOAD}"] = run_page_load(http, run, repeat=repeat)
        restored = restore_run(engine, run)
    finally:
        engine.dispose()
    return {"run_id": run, "turns": archived.turns, "parquet_bytes": archived.bytes,
            "archive_s": round(archived.seconds, 1), "restore_s": round(restored.seconds, 1),
            "archive_s_per_million_turns": _per_million(archived.seconds, archived.turns),
            "restore_s_per_million_turns": _per_million(restored.seconds, restored.turns), "requests": requests}


def run_js_requests(run: int) -> list[str]:
    """The requests run.js makes at once on load, read from run.js itself (so the bench cannot drift from
    the page): its fetch paths with the run id and its constants filled in."""
    script = (ROOT / "api" / "dashboard" / "static" / "run.js").read_text()
    constants = dict(re.findall(r"const ([A-Z_]+) = (\d+);", script))
    paths = re.findall(r"get\(`(/v1/runs/\$\{runId\}[^`]*)`\)", script)
    assert len(paths) == 3, paths
    return [re.sub(r"\$\{(\w+)\}", lambda m: str(run) if m[1] == "runId" else constants[m[1]], path) for path in paths]


def run_page_load(http: httpx.Client, run: int, *, repeat: int) -> dict[str, float]:
    """The run page as a browser loads it: the HTML, then the three requests run.js makes at once (the
    run, its metrics, its stats); p50/p95 of the time until the last answer."""
    fetched = run_js_requests(run)

    def load() -> None:
        http.get(f"/runs/{run}").raise_for_status()
        with ThreadPoolExecutor(len(fetched)) as pool:
            for response in pool.map(http.get, fetched):
                response.raise_for_status()

    return measure(http, load, repeat=repeat)


def measure(http: httpx.Client, path: str | Callable[[], None], *, repeat: int) -> dict[str, float]:
    """p50/p95 of `repeat` requests (or page loads) after two warm-ups; `first_ms` is the very first (cold)."""
    request = path if callable(path) else lambda: http.get(path).raise_for_status()
    started = time.perf_counter()
    request()
    first = (time.perf_counter() - started) * 1000
    request()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        request()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    return {"p50_ms": round(statistics.median(samples), 1), "p95_ms": round(p95, 1), "first_ms": round(first, 1),
            "n": repeat}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--skip-archive", action="store_true", help="Do not archive and restore a run.")
    args = parser.parse_args()
    url, store = prepare_store(args.turns)
    os.environ["CRUCIBLE_ARCHIVE_DIR"] = tempfile.mkdtemp(prefix="crucible-bench-archive-")
    base, server = serve(url)
    try:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {_token()}"}, timeout=600) as http:
            running = _running_run(http)
            results = {name: measure(http, path, repeat=args.repeat) for name, path in _targets(http, running).items()}
            results[PAGE_LOAD] = run_page_load(http, running, repeat=args.repeat)
            archived = None if args.skip_archive else archive_round_trip(url, http, repeat=args.repeat)
    finally:
        server.should_exit = True
        shutil.rmtree(os.environ["CRUCIBLE_ARCHIVE_DIR"], ignore_errors=True)
    every = {**results, **(archived["requests"] if archived else {})}
    report = {"store": {"database": make_url(url).database, **store}, "target_ms": TARGET_MS, "requests": results,
              "archive": archived, "all_p95_under_target": all(r["p95_ms"] < TARGET_MS for r in every.values()),
              "over_target": sorted(name for name, r in every.items() if r["p95_ms"] >= TARGET_MS)}
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
