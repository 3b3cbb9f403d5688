"""The turns table is partitioned by run (migration 0008): on a populated database the migration keeps
every turn where it was (the old table becomes the partition of the old runs, nothing copied), each
new run gets its own partition from the trigger on `runs`, a query that names the run reads only its
partition, and the downgrade puts every turn back in a plain table."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, create_engine, pool, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from core import archive
from core.models import Turn
from migrations import migrate
from scripts.seed_store import StoreShape, seed
from tests import factories

CHECKSUM = "SELECT count(*), md5(string_agg(turns::text, ',' ORDER BY run_id, episode_id, index)) FROM turns"
"""Every turn, every column of it (the search vector too), in one digest."""


@pytest.fixture
def scratch(empty_url: str) -> str:
    """An empty database (psycopg's URL)."""
    return make_url(empty_url).set(drivername="postgresql").render_as_string(hide_password=False)


def _sqlalchemy(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _partition_of(conn: psycopg.Connection, run_id: int) -> set[str]:
    rows = conn.execute("SELECT DISTINCT tableoid::regclass::text FROM turns WHERE run_id = %s", (run_id,)).fetchall()
    return {row[0] for row in rows}


def _add_turn(conn: psycopg.Connection, run_id: int, index: int) -> None:
    """One more turn on an episode of `run_id`."""
    episode = conn.execute("SELECT id FROM episodes WHERE run_id = %s ORDER BY id LIMIT 1", (run_id,)).fetchone()[0]
    conn.execute("INSERT INTO turns (run_id, episode_id, index, token_ids, logprobs, loss_mask, prompt_length, "
                 "completion_text, truncated, truncated_bytes) "
                 "VALUES (%s, %s, %s, '{1,2}', '{0,-0.5}', '{0,1}', 1, 'added after 0008', false, 0)",
                 (run_id, episode, index))


def test_0008_partitions_a_populated_store_without_copying_and_downgrades(scratch: str, tmp_path: Path) -> None:
    migrate.upgrade("0007", url=_sqlalchemy(scratch))
    seeded = seed(scratch, StoreShape(turns=3000, runs=2, batch_size=4), log=False)
    old_runs = [seeded["first_run_id"], seeded["first_run_id"] + 1]
    with psycopg.connect(scratch) as conn:
        before = conn.execute(CHECKSUM).fetchone()
    assert before[0] == 3000

    migrate.upgrade("0008", url=_sqlalchemy(scratch))
    with psycopg.connect(scratch, autocommit=True) as conn:
        assert conn.execute(CHECKSUM).fetchone() == before
        kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'turns'").fetchone()[0]
        assert kind == "p"  # partitioned
        assert conn.execute("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'turns_legacy'"
                            ).fetchone()[0] == f"FOR VALUES FROM (MINVALUE) TO ('{old_runs[1] + 1}')"
        for run_id in old_runs:
            assert _partition_of(conn, run_id) == {"turns_legacy"}
        # A new run: the trigger gives it its own partition; its turns and the old runs' go where they belong.
        seed(scratch, StoreShape(turns=500, runs=1, batch_size=4), log=False)
        new_run = old_runs[1] + 1
        assert _partition_of(conn, new_run) == {f"turns_run_{new_run}"}
        _add_turn(conn, old_runs[0], 1000)
        _add_turn(conn, new_run, 1000)
        assert _partition_of(conn, old_runs[0]) == {"turns_legacy"}
        plan = "\n".join(row[0] for row in conn.execute(
            "EXPLAIN SELECT * FROM turns WHERE run_id = %s AND episode_id = 1", (new_run,)).fetchall())
        assert f"turns_run_{new_run}" in plan and "turns_legacy" not in plan  # pruned to one partition
        # A run id at or below the legacy bound cannot get a partition of its own: its turns are legacy's.
        conn.execute("SELECT crucible_turns_partition(%s)", (old_runs[0],))
        assert conn.execute("SELECT to_regclass(%s)", (f"turns_run_{old_runs[0]}",)).fetchone()[0] is None
        after = conn.execute(CHECKSUM).fetchone()
    assert after[0] == 3000 + 500 + 2
    # A finished run from before partitioning archives out of turns_legacy and restores into it (with the
    # code of the head revision, which records the archive's hash on the run).
    migrate.upgrade("head", url=_sqlalchemy(scratch))
    with psycopg.connect(scratch) as conn:  # later revisions add columns (0011: version_runs), all NULL here
        at_head = conn.execute(CHECKSUM).fetchone()
    engine = create_engine(_sqlalchemy(scratch), poolclass=pool.NullPool)
    try:
        report = archive.archive_run(engine, old_runs[1], root=tmp_path)
        with psycopg.connect(scratch) as conn:
            assert _partition_of(conn, old_runs[1]) == set() and _partition_of(conn, old_runs[0]) == {"turns_legacy"}
        with pytest.raises(RuntimeError, match=f"runs {old_runs[1]} are archived"):  # its turns are in Parquet only
            migrate.downgrade("0007", url=_sqlalchemy(scratch))
        assert archive.restore_run(engine, old_runs[1], root=tmp_path).turns == report.turns > 0
    finally:
        engine.dispose()
    with psycopg.connect(scratch) as conn:
        assert conn.execute(CHECKSUM).fetchone() == at_head  # the restore gives back every row as it was
        assert _partition_of(conn, old_runs[1]) == {"turns_legacy"}

    migrate.downgrade("0007", url=_sqlalchemy(scratch))
    with psycopg.connect(scratch) as conn:
        assert conn.execute(CHECKSUM).fetchone() == after
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'turns'").fetchone()[0] == "r"
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'turns\\_%%' AND relkind = 'r'"
                            ).fetchone()[0] == 0
    migrate.upgrade("head", url=_sqlalchemy(scratch))
    with psycopg.connect(scratch) as conn:
        assert conn.execute(CHECKSUM).fetchone() == at_head


def test_every_run_gets_its_partition_even_when_ids_come_round_again(db_session: Session) -> None:
    """The suite empties tables with RESTART IDENTITY, so run ids repeat: the partition is reused."""
    first = factories.run(db_session).id
    db_session.commit()
    db_session.execute(text("TRUNCATE runs RESTART IDENTITY CASCADE"))
    db_session.commit()
    again = factories.run(db_session).id
    db_session.commit()
    assert again == first
    attached = db_session.execute(text("SELECT inhrelid::regclass::text FROM pg_inherits "
                                       "WHERE inhparent = 'turns'::regclass")).scalars().all()
    assert f"turns_run_{again}" in attached
    assert db_session.execute(select(Turn).where(Turn.run_id == again)).all() == []


def test_creating_a_run_waits_for_no_writer_of_episodes(engine: Engine) -> None:
    """A worker mid-transaction on episodes: a run is still created at once (the partition's attach locks
    only `turns`; with foreign keys to clone it would wait for the worker, then hold every writer of
    episodes and runs until the launch commits)."""
    with Session(engine) as worker, Session(engine) as launch, Session(engine) as other:
        worker.execute(text("LOCK TABLE episodes IN ROW EXCLUSIVE MODE"))  # as a worker storing an episode
        launch.execute(text("SET lock_timeout = '5s'"))
        factories.run(launch)  # flushed: its partition attached, the transaction open
        other.execute(text("SET lock_timeout = '5s'"))
        worker.commit()
        launch.commit()
        second = factories.run(other)
        other.commit()
        names = other.execute(text("SELECT inhrelid::regclass::text FROM pg_inherits "
                                   "WHERE inhparent = 'turns'::regclass")).scalars().all()
        assert f"turns_run_{second.id}" in names
    with Session(engine) as cleanup:
        cleanup.execute(text("TRUNCATE runs RESTART IDENTITY CASCADE"))
        cleanup.commit()


def test_a_turn_for_a_run_with_no_partition_is_refused(db_session: Session) -> None:
    """No default partition: a turn naming a run that does not exist fails loudly, never lands somewhere."""
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="no partition of relation"):
        db_session.execute(text("INSERT INTO turns (run_id, episode_id, index, token_ids, logprobs, loss_mask, "
                                "prompt_length) VALUES (987654, 1, 0, '{}', '{}', '{}', 0)"))
    db_session.rollback()
