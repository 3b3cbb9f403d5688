"""per-run episode and group counters kept by triggers (issue 14: the run page at any size)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 16:00:00

Three append-only ledgers (`core.models.counts`): statement-level AFTER triggers on `episodes` and
`episode_groups` read the statement's transition tables, aggregate them by run and key, and append one
signed row per key that changed (an UPDATE that moves no counted column appends nothing). A run's
figure is the sum of its rows; `core.counters.fold` compacts them. Appending takes no lock another
writer could wait on, so a thousand workers finishing episodes of one run never queue on a counter.

On a populated database the ledgers are filled from the tables in the migration's transaction, after
the triggers exist and with writers held off (SHARE ROW EXCLUSIVE), so no change is counted twice or
missed. A deleted run's rows go with it (a row trigger on runs; the episode trigger skips runs that
are gone, which is what the ON DELETE CASCADE of episodes sees); a TRUNCATE of episodes or groups empties
their ledgers.

Also `runs.archive_sha256`: an archive's SHA-256 recorded on its run when it is written, which reads and
restores check the file against (the manifest beside the file is no witness: whoever can rewrite one
can rewrite both). Runs archived before this revision have none; their manifest is trusted, as before.
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINITE_REWARD = ("CASE WHEN reward IS NULL OR reward IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8) "
                 "THEN NULL ELSE reward::numeric END")


def _episode_changes(source: str, sign: int) -> str:
    return (f"SELECT run_id, status, termination_reason, {sign} AS sign, {FINITE_REWARD} AS r, "
            f"coalesce(num_tokens, 0) AS tokens, coalesce(num_turns, 0) AS turns, "
            f"coalesce(cardinality(flags), 0) > 0 AS flagged, flags FROM {source}")


def _append_episodes(changes: str) -> str:
    """Append the signed sums of `changes` by (run, status, reason) and by (run, flag); keys whose sums
    are all zero append nothing."""
    return f"""
    WITH changes AS ({changes}),
    live AS (SELECT * FROM changes WHERE EXISTS (SELECT 1 FROM runs WHERE runs.id = changes.run_id)),
    sums AS (
      SELECT run_id, status, termination_reason, sum(sign) AS episodes, sum(sign * (r IS NOT NULL)::int) AS rewarded,
             coalesce(sum(sign * r), 0) AS reward_sum, coalesce(sum(sign * r * r), 0) AS reward_squares,
             sum(sign * tokens) AS tokens, sum(sign * turns) AS turns, sum(sign * flagged::int) AS flagged
      FROM live GROUP BY run_id, status, termination_reason),
    counted AS (
      INSERT INTO run_episode_counts
      SELECT * FROM sums
      WHERE episodes <> 0 OR rewarded <> 0 OR reward_sum <> 0 OR reward_squares <> 0 OR tokens <> 0 OR turns <> 0
         OR flagged <> 0)
    INSERT INTO run_flag_counts
    SELECT run_id, flag, sum(sign) FROM live, unnest(flags) AS flag WHERE flag IS NOT NULL
    GROUP BY run_id, flag HAVING sum(sign) <> 0"""


def _append_groups(changes: str) -> str:
    return f"""
    INSERT INTO run_group_counts
    SELECT run_id, status, sum(sign) FROM ({changes}) changes
    WHERE EXISTS (SELECT 1 FROM runs WHERE runs.id = changes.run_id)
    GROUP BY run_id, status HAVING sum(sign) <> 0"""


def _group_changes(source: str, sign: int) -> str:
    return f"SELECT run_id, status, {sign} AS sign FROM {source}"


def _trigger_function(name: str, append: Callable[[str], str], changes: Callable[[str, int], str]) -> str:
    """A statement trigger's function: INSERT counts the new rows, DELETE the old ones negated, UPDATE both."""
    both = f"{changes('new_rows', 1)} UNION ALL {changes('old_rows', -1)}"
    return f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN{append(changes('new_rows', 1))};
  ELSIF TG_OP = 'DELETE' THEN{append(changes('old_rows', -1))};
  ELSE{append(both)};
  END IF;
  RETURN NULL;
END $$"""


TABLES = {"episodes": ("crucible_count_episodes", _append_episodes, _episode_changes),
          "episode_groups": ("crucible_count_groups", _append_groups, _group_changes)}
TRANSITIONS = {"insert": "NEW TABLE AS new_rows", "update": "OLD TABLE AS old_rows NEW TABLE AS new_rows",
               "delete": "OLD TABLE AS old_rows"}

FORGET_RUN = """
CREATE FUNCTION crucible_forget_run_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM run_episode_counts WHERE run_id = OLD.id;
  DELETE FROM run_flag_counts WHERE run_id = OLD.id;
  DELETE FROM run_group_counts WHERE run_id = OLD.id;
  RETURN NULL;
END $$"""


FORGET_ALL = """
CREATE FUNCTION crucible_forget_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- Lock first: that waits for a fold in progress, and the DELETE's snapshot, taken after, holds the rows
  -- that fold inserted (without the lock they would be missed, and a live run would go on counting
  -- episodes that are gone).
  IF TG_TABLE_NAME = 'episodes' THEN
    LOCK TABLE run_episode_counts, run_flag_counts IN EXCLUSIVE MODE;
    DELETE FROM run_episode_counts;
    DELETE FROM run_flag_counts;
  ELSE
    LOCK TABLE run_group_counts IN EXCLUSIVE MODE;
    DELETE FROM run_group_counts;
  END IF;
  RETURN NULL;
END $$"""
"""TRUNCATE fires no DELETE trigger: emptying episodes (or groups) empties their ledgers."""


def upgrade() -> None:
    op.execute("""
        CREATE TABLE run_episode_counts (
          run_id bigint NOT NULL, status varchar(16) NOT NULL, termination_reason varchar(32),
          episodes bigint NOT NULL, rewarded bigint NOT NULL, reward_sum numeric NOT NULL,
          reward_squares numeric NOT NULL, tokens bigint NOT NULL, turns bigint NOT NULL, flagged bigint NOT NULL)""")
    op.execute("CREATE TABLE run_flag_counts (run_id bigint NOT NULL, flag varchar(32) NOT NULL, episodes bigint NOT NULL)")
    op.execute("CREATE TABLE run_group_counts (run_id bigint NOT NULL, status varchar(16) NOT NULL, groups bigint NOT NULL)")
    for table in ("run_episode_counts", "run_flag_counts", "run_group_counts"):
        op.execute(f"CREATE INDEX ix_{table}_run_id ON {table} (run_id)")
    # Writers wait from here to the commit: the triggers and the backfill see the same rows.
    op.execute("LOCK TABLE runs, episode_groups, episodes IN SHARE ROW EXCLUSIVE MODE")
    for table, (function, append, changes) in TABLES.items():
        op.execute(_trigger_function(function, append, changes))
        for event, transition in TRANSITIONS.items():
            op.execute(f"CREATE TRIGGER {function}_{event} AFTER {event.upper()} ON {table} "
                       f"REFERENCING {transition} FOR EACH STATEMENT EXECUTE FUNCTION {function}()")
    op.execute(FORGET_RUN)
    op.execute("CREATE TRIGGER crucible_forget_run_counts AFTER DELETE ON runs "
               "FOR EACH ROW EXECUTE FUNCTION crucible_forget_run_counts()")
    op.add_column("runs", sa.Column("archive_sha256", sa.String(64), nullable=True))
    op.execute(FORGET_ALL)
    for table in TABLES:
        op.execute(f"CREATE TRIGGER crucible_forget_counts AFTER TRUNCATE ON {table} "
                   "FOR EACH STATEMENT EXECUTE FUNCTION crucible_forget_counts()")
    op.execute(_append_episodes(_episode_changes("episodes", 1)))
    op.execute(_append_groups(_group_changes("episode_groups", 1)))


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP TRIGGER crucible_forget_counts ON {table}")
    op.execute("DROP FUNCTION crucible_forget_counts()")
    op.execute("DROP TRIGGER crucible_forget_run_counts ON runs")
    op.execute("DROP FUNCTION crucible_forget_run_counts()")
    for table, (function, _append, _changes) in TABLES.items():
        for event in TRANSITIONS:
            op.execute(f"DROP TRIGGER {function}_{event} ON {table}")
        op.execute(f"DROP FUNCTION {function}()")
    op.execute("DROP TABLE run_episode_counts, run_flag_counts, run_group_counts")
    op.drop_column("runs", "archive_sha256")
