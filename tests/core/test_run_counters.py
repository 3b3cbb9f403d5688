"""The per-run counters (migration 0009, `core.counters`) always equal counting the episodes and groups:
after bulk inserts, updates through every counted column (non-finite rewards included), deletes,
rolled-back transactions, a deleted run, folds — and a fold or a writer never waits on another writer.
The migration fills them on a populated store."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from core import counters
from migrations import migrate
from scripts.seed_store import StoreShape, seed

FINITE = "CASE WHEN reward IS NULL OR reward IN ('NaN', 'Infinity', '-Infinity') THEN NULL ELSE reward::numeric END"
RECOUNT = f"""
    SELECT status, termination_reason, count(*), count(r), coalesce(sum(r), 0), coalesce(sum(r * r), 0),
           sum(num_tokens), sum(num_turns), count(*) FILTER (WHERE cardinality(flags) > 0)
    FROM (SELECT *, {FINITE} AS r FROM episodes WHERE run_id = %(run)s) e GROUP BY status, termination_reason"""


def _psycopg(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _sqlalchemy(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


@pytest.fixture
def store(empty_url: str) -> str:
    """A migrated scratch database holding two seeded runs (psycopg URL)."""
    migrate.upgrade("head", url=_sqlalchemy(empty_url))
    seed(_psycopg(empty_url), StoreShape(turns=4000, runs=2, batch_size=4), log=False)
    return _psycopg(empty_url)


def _truth(conn: psycopg.Connection, run_id: int) -> dict[str, Any]:
    episodes = {(status, reason): (n, rewarded, Decimal(total), Decimal(squares), tokens, turns, flagged)
                for status, reason, n, rewarded, total, squares, tokens, turns, flagged
                in conn.execute(RECOUNT, {"run": run_id})}
    flags = dict(conn.execute("SELECT flag, count(*) FROM episodes, unnest(flags) flag WHERE run_id = %s "
                              "AND flag IS NOT NULL GROUP BY flag", (run_id,)).fetchall())
    groups = dict(conn.execute("SELECT status, count(*) FROM episode_groups WHERE run_id = %s GROUP BY status",
                               (run_id,)).fetchall())
    return {"episodes": episodes, "flags": flags, "groups": groups}


def _counted(url: str, run_id: int) -> dict[str, Any]:
    engine = create_engine(_sqlalchemy(url), poolclass=pool.NullPool)
    try:
        with Session(engine) as session:
            counts = counters.run_counts(session, run_id=run_id)
    finally:
        engine.dispose()
    episodes = {key: (c.episodes, c.rewarded, c.reward_sum, c.reward_squares, c.tokens, c.turns, c.flagged)
                for key, c in counts.episodes.items()}
    return {"episodes": episodes, "flags": counts.flags, "groups": counts.groups}


def _runs(conn: psycopg.Connection) -> list[int]:
    return [row[0] for row in conn.execute("SELECT id FROM runs ORDER BY id")]


def _ledger_rows(conn: psycopg.Connection) -> int:
    return sum(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in counters.LEDGERS)


def _fold(url: str, run_id: int) -> None:
    engine = create_engine(_sqlalchemy(url), poolclass=pool.NullPool)
    try:
        with Session(engine) as session, session.begin():
            counters.fold(session, run_id=run_id)
    finally:
        engine.dispose()


def test_counters_equal_a_recount_through_every_kind_of_change(store: str) -> None:
    with psycopg.connect(store, autocommit=True) as conn:
        runs = _runs(conn)
        assert [_counted(store, run) for run in runs] == [_truth(conn, run) for run in runs]
        # What workers, the judge and the controller do, and worse: rewards that are not finite, rewards
        # adjusted again, flags added and removed, episodes and groups deleted, a run with none left.
        changes = [
            "UPDATE episodes SET status = 'completed', termination_reason = 'submitted', reward = 0.1 * (id % 7), "
            "flags = CASE WHEN id % 5 = 0 THEN ARRAY['forged_exit', 'test_tamper'] ELSE '{}' END WHERE id % 3 = 0",
            "UPDATE episodes SET reward = 'NaN' WHERE id % 11 = 0",
            "UPDATE episodes SET reward = CASE WHEN id % 2 = 0 THEN 'Infinity'::float8 ELSE '-Infinity' END "
            "WHERE id % 13 = 0",
            "UPDATE episodes SET reward = reward + 0.3, num_turns = num_turns + 1, num_tokens = num_tokens * 2 "
            "WHERE id % 4 = 1",
            "UPDATE episodes SET flags = '{}' WHERE id % 10 = 0",
            "UPDATE episodes SET flags = ARRAY[NULL, 'forged_exit']::varchar[] WHERE id % 29 = 0",  # no writer fails
            "UPDATE episodes SET status = 'failed', termination_reason = 'worker_lost', reward = NULL WHERE id % 17 = 0",
            "UPDATE episode_groups SET status = 'dropped' WHERE id % 3 = 0",
            "DELETE FROM episodes WHERE id % 19 = 0",
            "DELETE FROM episode_groups g WHERE id % 23 = 0",
        ]
        for change in changes:
            conn.execute(change)
            assert [_counted(store, run) for run in runs] == [_truth(conn, run) for run in runs], change

        # A change that moves no counted column appends nothing; a rolled-back one leaves no trace.
        rows = _ledger_rows(conn)
        conn.execute("UPDATE episodes SET timings = '{\"total\": 1.5}', worker = 'w' WHERE id % 2 = 0")
        assert _ledger_rows(conn) == rows
        with pytest.raises(psycopg.errors.RaiseException), conn.transaction():
            conn.execute("UPDATE episodes SET status = 'running', reward = 5 WHERE run_id = %s", (runs[0],))
            conn.execute("DO $$ BEGIN RAISE EXCEPTION 'abort'; END $$")
        assert _ledger_rows(conn) == rows

        # Folding leaves one row per key and the same figures.
        expected = _counted(store, runs[0])
        _fold(store, runs[0])
        assert _counted(store, runs[0]) == expected == _truth(conn, runs[0])
        keys = len(expected["episodes"]) + len(expected["flags"]) + len(expected["groups"])
        assert conn.execute("SELECT count(*) FROM run_episode_counts WHERE run_id = %s", (runs[0],)).fetchone()[0] \
            == len(expected["episodes"])
        assert sum(conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = %s", (runs[0],)).fetchone()[0]
                   for t in counters.LEDGERS) == keys

        # A deleted run takes its ledger rows along (its episodes cascade); the other run is untouched.
        other = _counted(store, runs[1])
        conn.execute("DELETE FROM runs WHERE id = %s", (runs[0],))
        assert sum(conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = %s", (runs[0],)).fetchone()[0]
                   for t in counters.LEDGERS) == 0
        assert _counted(store, runs[1]) == other == _truth(conn, runs[1])

        # TRUNCATE fires no DELETE trigger; the ledgers are emptied with the tables (runs cascades to both).
        conn.execute("TRUNCATE runs CASCADE")
        assert _ledger_rows(conn) == 0


def test_writers_and_folds_never_wait_on_each_other(store: str) -> None:
    """Two workers finishing episodes of one run, and the controller folding it, hold no lock the others
    need (a shared counter row would queue them all): each statement below would fail on its lock
    timeout if it had to wait."""
    with psycopg.connect(store, autocommit=True) as conn:
        run = _runs(conn)[0]
        ids = [row[0] for row in conn.execute("SELECT id FROM episodes WHERE run_id = %s ORDER BY id LIMIT 3", (run,))]
    with psycopg.connect(store) as first, psycopg.connect(store) as second, psycopg.connect(store) as folder:
        for conn in (first, second, folder):
            conn.execute("SET lock_timeout = '5s'")
        first.execute("UPDATE episodes SET status = 'completed', termination_reason = 'submitted', reward = 1 "
                      "WHERE id = %s", (ids[0],))
        second.execute("UPDATE episodes SET status = 'completed', termination_reason = 'max_turns', reward = 0 "
                       "WHERE id = %s", (ids[1],))
        folder.execute(counters._FOLD["run_episode_counts"].replace(":run", "%(run)s"), {"run": run})
        first.execute("UPDATE episodes SET reward = 0.5 WHERE id = %s", (ids[2],))
        second.commit()
        folder.commit()
        first.commit()
    with psycopg.connect(store) as conn:
        assert _counted(store, run) == _truth(conn, run)


def _fold_blocking(store: str, run: int, statement: str) -> None:
    """`statement` runs while a fold of `run` is uncommitted (it waits for the fold), then the fold commits."""
    engine = create_engine(_sqlalchemy(store), poolclass=pool.NullPool)
    try:
        with Session(engine) as folder:
            counters.fold(folder, run_id=run)
            other = threading.Thread(target=lambda: psycopg.connect(store, autocommit=True).execute(statement))
            other.start()
            other.join(timeout=1)  # it waits for what the fold holds
            folder.commit()
            other.join()
    finally:
        engine.dispose()


def test_a_truncate_or_a_run_deleted_during_a_fold_leaves_no_count_behind(store: str) -> None:
    """The fold inserts its sums in a transaction the forget triggers wait for: a DELETE in them would not
    see those rows, and a live run would go on counting episodes that are gone."""
    with psycopg.connect(store, autocommit=True) as conn:
        first, second = _runs(conn)
        _fold_blocking(store, first, f"DELETE FROM runs WHERE id = {first}")
        assert sum(conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = %s", (first,)).fetchone()[0]
                   for t in counters.LEDGERS) == 0
        _fold_blocking(store, second, "TRUNCATE episodes, episode_groups CASCADE")
        assert _ledger_rows(conn) == 0 and _truth(conn, second) == {"episodes": {}, "flags": {}, "groups": {}}


def test_the_migration_counts_a_populated_store(empty_url: str) -> None:
    migrate.upgrade("0008", url=_sqlalchemy(empty_url))
    url = _psycopg(empty_url)
    seed(url, StoreShape(turns=3000, runs=2, batch_size=4), log=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE episodes SET flags = ARRAY['forged_exit'] WHERE id % 4 = 0")
    migrate.upgrade("0009", url=_sqlalchemy(empty_url))
    with psycopg.connect(url) as conn:
        runs = _runs(conn)
        assert [_counted(url, run) for run in runs] == [_truth(conn, run) for run in runs]
        assert all(_truth(conn, run)["flags"] for run in runs)
    migrate.downgrade("0008", url=_sqlalchemy(empty_url))
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regclass('run_episode_counts')").fetchone()[0] is None
        conn.execute("UPDATE episodes SET flags = '{}'")  # no trigger left behind to fail


def test_the_ledger_is_folded_once_it_grows_past_its_bound(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One statement per episode (what workers do) appends rows; `fold_if_long` (the controller, every
    pass) compacts them past FOLD_AT and leaves a short ledger alone."""
    monkeypatch.setattr(counters, "FOLD_AT", 20)
    with psycopg.connect(store, autocommit=True) as conn:
        run = _runs(conn)[0]
        for episode in [row[0] for row in conn.execute("SELECT id FROM episodes WHERE run_id = %s LIMIT 30", (run,))]:
            conn.execute("UPDATE episodes SET reward = coalesce(reward, 0) + 0.25 WHERE id = %s", (episode,))
        engine = create_engine(_sqlalchemy(store), poolclass=pool.NullPool)
        try:
            with Session(engine) as session, session.begin():
                assert counters.ledger_rows(session, run_id=run) > 20
                assert counters.fold_if_long(session, run_id=run)
            with Session(engine) as session, session.begin():
                assert counters.ledger_rows(session, run_id=run) <= 20
                assert not counters.fold_if_long(session, run_id=run)
        finally:
            engine.dispose()
        assert _counted(store, run) == _truth(conn, run)
