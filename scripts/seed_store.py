"""Seed a large synthetic trajectory store fast — INSERT … SELECT generate_series, no Python loops
over rows — for benchmarks of the API and dashboard (bench/api.py) and manual scale tests.

    .venv/bin/python scripts/seed_store.py --turns 1000000                       # CRUCIBLE_DATABASE_URL
    .venv/bin/python scripts/seed_store.py --turns 1000000 --database-url postgresql://postgres@127.0.0.1/x

The store holds two environments with 500 tasks each, `--runs` runs (the first running, the others
completed), groups of `--group-size` rollouts, episodes of ~`--turns-per-episode` turns (exactly
`--turns` turns in all), training steps, policy versions and sandbox events. Values are derived from
ids, so two seeds of the same shape are identical. It appends to whatever the database holds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENVIRONMENTS = ("code-fix", "web-nav")
T0 = "2026-01-05 12:00:00+00"
ACTIONS = ["run the tests", "edit calc.py", "read the traceback", "list the files", "submit the patch",
           "grep for the bug", "open parser.py", "check the diff"]
OBSERVATIONS = ["ok: 3 passed", "Traceback (most recent call last): AssertionError in test_add",
                "calc.py parser.py tests/", "diff --git a/calc.py b/calc.py", "error: command timed out"]
REASONS = ["max_turns", "context_exhausted", "episode_timeout", "format_error", "tool_error_limit", "submitted"]


@dataclass(frozen=True)
class StoreShape:
    turns: int = 1_000_000
    turns_per_episode: int = 8
    """Average; each episode has this ±3 (a 7-cycle), so the total is exact after trimming."""
    group_size: int = 8
    runs: int = 2
    batch_size: int = 16
    """Groups per training step (one policy version per step)."""
    tasks_per_environment: int = 500
    tokens_per_turn: int = 24

    @property
    def groups(self) -> int:
        """Enough groups for `turns` with room to spare (running rollouts have no turns yet); `_trim` cuts."""
        return math.ceil(self.turns / self.turns_per_episode / self.group_size * 1.1) + 2 * self.batch_size + 2


def scalar(conn: psycopg.Connection, query: str, params: tuple[Any, ...] = ()) -> Any:
    """The one value a query returns (its first row's first column)."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise LookupError(f"no row: {query}")
    return row[0]


def _next_ids(conn: psycopg.Connection) -> dict[str, int]:
    tables = ("environments", "tasks", "runs", "episode_groups", "episodes", "training_steps", "policy_versions",
              "sandbox_events")
    return {table: scalar(conn, f"SELECT coalesce(max(id), 0) + 1 FROM {table}") for table in tables}


def _environments_and_tasks(conn: psycopg.Connection, shape: StoreShape, ids: dict[str, int], tag: str) -> None:
    for offset, name in enumerate(ENVIRONMENTS):
        spec = {"name": f"{name}-{tag}", "kind": "code_repo", "image": "code-repo"}
        conn.execute(
            "INSERT INTO environments (id, name, version, kind, spec, spec_hash, description) "
            "VALUES (%s, %s, 1, 'code_repo', %s, md5(%s) || md5(%s), %s)",
            (ids["environments"] + offset, spec["name"], json.dumps(spec), spec["name"], tag, f"synthetic {name}"))
    conn.execute("""
        INSERT INTO tasks (id, environment_name, external_id, split, instruction, payload, pass_rate_samples, difficulty)
        SELECT %(base)s + n, e.name, 'task-' || n, CASE WHEN n %% 10 = 0 THEN 'test' ELSE 'train' END,
               'Fix the failing test number ' || n || ' in calc.py', '{"repo": {"format": "tar", "data_b64": ""}}',
               0, (ARRAY['easy', 'medium', 'hard'])[1 + n %% 3]
        FROM generate_series(0, 2 * %(per)s - 1) n
        JOIN environments e ON e.id = %(env)s + n / %(per)s""",
        {"base": ids["tasks"], "per": shape.tasks_per_environment, "env": ids["environments"]})


def _runs(conn: psycopg.Connection, shape: StoreShape, ids: dict[str, int], tag: str) -> None:
    per_run = math.ceil(shape.groups / shape.runs)
    conn.execute("""
        INSERT INTO runs (id, name, status, purpose, model, mode, group_size, batch_size, max_staleness, policy_version,
                          config, started_at)
        SELECT %(base)s + r, 'bench-' || %(tag)s || '-' || r, CASE WHEN r = 0 THEN 'running' ELSE 'completed' END, 'train',
               'tiny-served', 'async', %(g)s, %(b)s, 2, %(steps)s, jsonb_build_object('name', 'bench-' || r), %(t0)s
        FROM generate_series(0, %(runs)s - 1) r""",
        {"base": ids["runs"], "tag": tag, "g": shape.group_size, "b": shape.batch_size,
         "steps": math.ceil(per_run / shape.batch_size), "runs": shape.runs, "t0": T0})
    conn.execute("""
        INSERT INTO run_environments (run_id, environment_id, weight)
        SELECT %(runs)s + r, %(envs)s + e, 1.0 FROM generate_series(0, %(n)s - 1) r, generate_series(0, 1) e""",
        {"runs": ids["runs"], "envs": ids["environments"], "n": shape.runs})


def _groups(conn: psycopg.Connection, shape: StoreShape, ids: dict[str, int]) -> None:
    """Group k belongs to run k / per_run; the last two batches of the running run are not trained on yet."""
    conn.execute("""
        WITH g AS (
          SELECT k, k / %(per)s AS r, k %% %(per)s AS gi, (k %% %(per)s) / %(b)s AS v,
                 least(%(per)s, %(total)s - (k / %(per)s) * %(per)s) AS run_groups
          FROM generate_series(0, %(total)s - 1) k)
        INSERT INTO episode_groups (id, run_id, group_index, task_id, environment_id, size, policy_version, status,
                                    consumed_step, created_at)
        SELECT %(gid)s + k, %(run)s + r, gi, %(task)s + (k %% 2) * %(tasks)s + (k * 7) %% %(tasks)s, %(env)s + k %% 2,
               %(size)s, v,
               CASE WHEN r = 0 AND gi >= run_groups - 2 * %(b)s THEN 'running' ELSE 'consumed' END,
               CASE WHEN r = 0 AND gi >= run_groups - 2 * %(b)s THEN NULL ELSE v + 1 + (gi %% 3 = 0)::int END,
               %(t0)s::timestamptz + k * interval '4 seconds'
        FROM g""",
        {"per": math.ceil(shape.groups / shape.runs), "b": shape.batch_size, "total": shape.groups,
         "gid": ids["episode_groups"], "run": ids["runs"], "task": ids["tasks"], "tasks": shape.tasks_per_environment,
         "env": ids["environments"], "size": shape.group_size, "t0": T0})


def _episodes(conn: psycopg.Connection, shape: StoreShape, ids: dict[str, int]) -> None:
    """Rewards improve along a run; running groups have half their rollouts still running."""
    conn.execute("""
        WITH x AS (
          SELECT g.*, s, %(eid)s + (g.id - %(gid)s) * %(size)s + s AS eid,
                 ((((g.id - %(gid)s) * %(size)s + s) * 2654435761) %% 1000) / 1000.0 AS h,
                 0.15 + 0.6 * g.group_index / greatest(max(g.group_index) OVER (PARTITION BY g.run_id), 1) AS p,
                 g.status = 'running' AND s %% 2 = 1 AS live
          FROM episode_groups g, generate_series(0, %(size)s - 1) s WHERE g.id >= %(gid)s),
        y AS (
          SELECT x.*, CASE WHEN live THEN NULL WHEN h < 0.01 THEN NULL WHEN h < p THEN 1.0
                           WHEN h < p + 0.1 THEN 0.5 ELSE 0.0 END AS reward,
                 CASE WHEN live THEN 0 ELSE greatest(1, %(tpe)s + (eid %% 7) - 3) END AS turns
          FROM x)
        INSERT INTO episodes (id, run_id, group_id, sample_index, task_id, environment_id, status, attempts, failures,
                              termination_reason, reward, reward_components, policy_version, policy_version_last,
                              num_turns, num_tokens, timings, verifier_layers, sandbox_id, worker, started_at, finished_at,
                              created_at)
        SELECT eid, run_id, id, s, task_id, environment_id,
               CASE WHEN live THEN 'running' WHEN reward IS NULL THEN 'failed' ELSE 'completed' END, 1, '[]',
               CASE WHEN live THEN NULL WHEN reward IS NULL THEN 'sandbox_error' WHEN reward = 1.0 THEN 'submitted'
                    ELSE (%(reasons)s::text[])[1 + (eid * 31) %% 6] END,
               reward,
               CASE WHEN reward IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('format', (h > 0.05)::int,
                    'public_tests', round(least(1, reward + 0.25 * (h > 0.5)::int), 2), 'hidden_tests', reward) END,
               policy_version, policy_version, turns, turns * %(tokens)s,
               CASE WHEN live THEN '{}'::jsonb ELSE jsonb_build_object('generation', 2 + 4 * h, 'sandbox', 1 + 3 * h,
                    'verify', 0.5 + h, 'total', 3.5 + 8 * h) END,
               CASE WHEN reward IS NULL THEN '[]'::jsonb ELSE jsonb_build_array(
                    jsonb_build_object('name', 'format', 'score', 1, 'passed', true, 'detail', '', 'duration_s', 0.01),
                    jsonb_build_object('name', 'hidden_tests', 'score', reward, 'passed', reward = 1.0,
                                       'detail', 'pytest summary', 'duration_s', 0.8)) END,
               'sb-' || to_hex(eid), 'worker-' || (eid %% 4), created_at,
               CASE WHEN live THEN NULL ELSE created_at + interval '20 seconds' + s * interval '1 second' END, created_at
        FROM y""",
        {"eid": ids["episodes"], "gid": ids["episode_groups"], "size": shape.group_size, "tpe": shape.turns_per_episode,
         "tokens": shape.tokens_per_turn, "reasons": REASONS})


def _trim(conn: psycopg.Connection, shape: StoreShape, ids: dict[str, int]) -> None:
    """Keep exactly `shape.turns` turns: drop the episodes past the cut and shorten the one across it."""
    conn.execute("""
        CREATE TEMP TABLE cut ON COMMIT DROP AS
        SELECT id, sum(num_turns) OVER (ORDER BY id) - num_turns AS start, num_turns FROM episodes WHERE id >= %(eid)s""",
        {"eid": ids["episodes"]})
    conn.execute("DELETE FROM episodes e USING cut WHERE e.id = cut.id AND cut.start >= %(n)s AND e.num_turns > 0",
                 {"n": shape.turns})
    conn.execute("""UPDATE episodes e SET num_turns = %(n)s - cut.start, num_tokens = (%(n)s - cut.start) * %(tok)s
                    FROM cut WHERE e.id = cut.id AND cut.start < %(n)s AND cut.start + cut.num_turns > %(n)s""",
                 {"n": shape.turns, "tok": shape.tokens_per_turn})
    conn.execute("DELETE FROM episode_groups g WHERE g.id >= %(gid)s AND NOT EXISTS "
                 "(SELECT 1 FROM episodes e WHERE e.group_id = g.id)", {"gid": ids["episode_groups"]})


def _token_arrays(shape: StoreShape) -> dict[str, Any]:
    """Two token layouts (a third environment text, the rest sampled); the contents do not matter here."""
    n, context = shape.tokens_per_turn, shape.tokens_per_turn // 3
    return {
        "ids_a": [(7 * i) % 50_000 for i in range(n)], "ids_b": [(13 * i + 5) % 50_000 for i in range(n)],
        "lps": [0.0] * context + [-0.05 * (1 + i % 9) for i in range(n - context)],
        "mask": [0] * context + [1] * (n - context), "context": context,
    }


def _turns(conn: psycopg.Connection, shape: StoreShape, ids: dict[str, int]) -> None:
    """The GIN index is dropped for the load and rebuilt after (much faster than maintaining it row by row)."""
    conn.execute("DROP INDEX IF EXISTS ix_turns_search")
    conn.execute("""
        INSERT INTO turns (run_id, episode_id, index, token_ids, logprobs, loss_mask, prompt_length, completion_text,
                           tool_call, observation, tool_output_full, exit_code, tool_status, duration_s, generation_s,
                           truncated, truncated_bytes, weight_version, finish_reason, created_at)
        SELECT e.run_id, e.id, i, CASE WHEN i %% 2 = 0 THEN %(ids_a)s::int[] ELSE %(ids_b)s::int[] END,
               %(lps)s::real[], %(mask)s::smallint[], %(context)s,
               'I will ' || (%(actions)s::text[])[1 + (e.id * 7 + i * 3) %% 8] || ' now, step ' || i
                 || CASE WHEN (e.id * 13 + i) %% 997 = 0 THEN ' after the segfault' ELSE '' END,
               jsonb_build_object('name', (ARRAY['bash', 'edit', 'submit'])[1 + (e.id + i) %% 3],
                                  'arguments', jsonb_build_object('command', 'python -m pytest -q tests/test_' || i || '.py')),
               (%(observations)s::text[])[1 + (e.id + i * 5) %% 5],
               (%(observations)s::text[])[1 + (e.id + i * 5) %% 5],
               CASE WHEN (e.id + i * 5) %% 5 IN (1, 4) THEN 1 ELSE 0 END, 'ok', 0.2 + (i %% 5) * 0.3, 0.4,
               (e.id + i) %% 17 = 0, CASE WHEN (e.id + i) %% 17 = 0 THEN 2048 ELSE 0 END, e.policy_version, 'stop',
               e.started_at + i * interval '2 seconds'
        FROM episodes e, generate_series(0, e.num_turns - 1) i
        WHERE e.id >= %(eid)s AND e.num_turns > 0""",
        {**_token_arrays(shape), "actions": ACTIONS, "observations": OBSERVATIONS, "eid": ids["episodes"]})
    conn.execute("SET maintenance_work_mem = '512MB'")
    conn.execute("CREATE INDEX ix_turns_search ON turns USING gin (search)")


def _training(conn: psycopg.Connection, ids: dict[str, int]) -> None:
    """One training step and one policy version per consumed step, with loss, reward and timing metrics."""
    conn.execute("""
        INSERT INTO training_steps (run_id, step, policy_version, metrics, created_at)
        SELECT g.run_id, g.consumed_step, g.consumed_step,
               jsonb_build_object('loss/policy', 0.5 / (1 + g.consumed_step), 'reward/mean', avg(e.reward),
                                  'timing_s/update', 3.5, 'timing_s/sync', 0.8, 'policy/entropy', 1.2 - 0.01 * g.consumed_step),
               min(g.created_at) + interval '1 minute'
        FROM episode_groups g JOIN episodes e ON e.group_id = g.id
        WHERE g.id >= %(gid)s AND g.consumed_step IS NOT NULL GROUP BY g.run_id, g.consumed_step""",
        {"gid": ids["episode_groups"]})
    conn.execute("""
        INSERT INTO policy_versions (run_id, version, checkpoint_path, training_step, sync_seconds, probe_kl)
        SELECT run_id, step, 'checkpoints/step-' || step, step, 0.8, 1e-6 FROM training_steps
        WHERE run_id >= %(run)s""", {"run": ids["runs"]})


def _sandbox_events(conn: psycopg.Connection, ids: dict[str, int]) -> None:
    """Lifecycle events for every tenth ended episode."""
    conn.execute("""
        INSERT INTO sandbox_events (sandbox_id, container_id, kind, worker, run_id, episode_id, duration_ms, detail,
                                    created_at)
        SELECT e.sandbox_id, md5(e.sandbox_id), k.kind, e.worker, e.run_id, e.id, 5.0 * k.n,
               CASE WHEN k.kind = 'exec' THEN jsonb_build_object('command', 'python -m pytest -q', 'exit_code', e.id %% 2)
                    ELSE '{}'::jsonb END,
               e.started_at + k.n * interval '1 second'
        FROM episodes e, (VALUES (0, 'acquire'), (1, 'exec'), (2, 'reset'), (3, 'release')) AS k(n, kind)
        WHERE e.id >= %(eid)s AND e.id %% 10 = 0 AND e.finished_at IS NOT NULL""", {"eid": ids["episodes"]})


def _fix_sequences(conn: psycopg.Connection) -> None:
    for table in ("environments", "tasks", "runs", "episode_groups", "episodes", "training_steps", "policy_versions",
                  "sandbox_events"):
        conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT coalesce(max(id), 1) FROM {table}))")


def backfill_points(url: str) -> int:
    """Write each training step's run-page point (training_steps.points) where it has none, as the trainer
    writes it with every step (`core.step_points.backfill_points`, what `crucible runs points` runs);
    returns the steps filled."""
    from sqlalchemy import create_engine, pool, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.orm import Session

    from core.step_points import backfill_points as backfill

    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"), poolclass=pool.NullPool)
    try:
        with Session(engine) as session:
            if not session.execute(text("SELECT 1 FROM information_schema.columns WHERE table_name = 'training_steps' "
                                        "AND column_name = 'points'")).first():
                return 0  # a store before migration 0008
            filled = sum(backfill(session).values())
            session.commit()
    finally:
        engine.dispose()
    return filled


def seed(url: str, shape: StoreShape, *, log: bool = True) -> dict[str, Any]:
    """Seed `shape` into the database at `url` (a postgresql:// URL); returns counts and seconds."""
    started = time.monotonic()
    tag = f"{int(time.time() * 1000) % 10**9:x}"
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")
        ids = _next_ids(conn)
        steps = [("environments and tasks", lambda: _environments_and_tasks(conn, shape, ids, tag)),
                 ("runs", lambda: _runs(conn, shape, ids, tag)), ("groups", lambda: _groups(conn, shape, ids)),
                 ("episodes", lambda: _episodes(conn, shape, ids)), ("trim", lambda: _trim(conn, shape, ids)),
                 ("turns", lambda: _turns(conn, shape, ids)), ("training", lambda: _training(conn, ids)),
                 ("sandbox events", lambda: _sandbox_events(conn, ids)), ("sequences", lambda: _fix_sequences(conn))]
        for name, step in steps:
            begun = time.monotonic()
            step()
            if log:
                print(f"seed: {name} in {time.monotonic() - begun:.1f} s", file=sys.stderr)
        conn.commit()
    backfill_points(url)  # as the trainer writes them; before the VACUUM, which clears the rows it replaced
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) episodes, episode_groups, turns, training_steps, sandbox_events")
        counts = {table: scalar(conn, f"SELECT count(*) FROM {table} WHERE run_id >= %s", (ids["runs"],))
                  for table in ("episode_groups", "episodes", "turns")}
    return {"first_run_id": ids["runs"], "runs": shape.runs, **counts, "seconds": round(time.monotonic() - started, 1)}


def _database_url(given: str | None) -> str:
    from sqlalchemy.engine import make_url

    if given is None:
        from core.db import resolve_database_url

        given = resolve_database_url()
    return make_url(given).set(drivername="postgresql").render_as_string(hide_password=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = StoreShape()
    parser.add_argument("--turns", type=int, default=defaults.turns)
    parser.add_argument("--turns-per-episode", type=int, default=defaults.turns_per_episode)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--runs", type=int, default=defaults.runs)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--database-url", default=None, help="Default: CRUCIBLE_DATABASE_URL (or the embedded one).")
    args = parser.parse_args()
    if args.turns < 1 or args.turns_per_episode < 4 or args.group_size < 1 or args.runs < 1 or args.batch_size < 1:
        parser.error("expected --turns ≥ 1, --turns-per-episode ≥ 4 and positive --group-size, --runs, --batch-size")
    shape = StoreShape(turns=args.turns, turns_per_episode=args.turns_per_episode, group_size=args.group_size,
                       runs=args.runs, batch_size=args.batch_size)
    result = seed(_database_url(args.database_url), shape)
    sys.stdout.write(json.dumps({"shape": asdict(shape), **result}) + "\n")


if __name__ == "__main__":
    main()
