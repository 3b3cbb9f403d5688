"""turns partitioned by run; archived runs; per-step aggregates (issue 14, the store at scale)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:40:00

`turns` becomes a table partitioned by RANGE (run_id), one run per partition (`turns_run_<id>`),
and the function `crucible_turns_partition(run_id)` creates a run's partition; a trigger calls it
for every new run row (so no code path can insert a turn its run has no partition for). turns keeps
no foreign keys (see PARTITION_FUNCTION): the partition stands for the run.

On a populated database nothing is copied: the old table is renamed `turns_legacy` and attached as
the partition of every run id up to the largest one (a CHECK constraint validated first, one
sequential scan, lets the attach skip its own); new runs get their own partitions. An empty old
table is dropped instead. The downgrade copies the rows back into a plain table (and refuses while a
run is archived: its turns are in Parquet only).

Also: `runs.archived_at` / `runs.archive_path` (`crucible runs archive`: the run's turns in Parquet
files) and `training_steps.points` (the run page's per-step aggregate, written by the trainer).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PARTITION_FUNCTION = """
CREATE FUNCTION crucible_turns_partition(run bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  name text := 'turns_run_' || run;
BEGIN
  IF run <= {legacy_last_run} THEN
    RETURN;  -- a run from before partitioning: turns_legacy holds its turns
  END IF;
  IF to_regclass(name) IS NOT NULL AND EXISTS (SELECT 1 FROM pg_inherits
                                                 WHERE inhparent = 'turns'::regclass AND inhrelid = to_regclass(name)) THEN
    RETURN;  -- already a partition: the run id came round again (a sequence restarted)
  END IF;
  -- CREATE then ATTACH: attaching takes SHARE UPDATE EXCLUSIVE on `turns` (held until the run's
  -- transaction commits), which never waits for (nor blocks) the workers reading and writing other
  -- runs' turns, where CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE. Two launches at
  -- once queue on it, one after the other. turns has no foreign keys: cloning them onto the partition
  -- would lock runs and episodes against every writer until the launch commits, and deadlock two
  -- launches.
  EXECUTE format('CREATE TABLE IF NOT EXISTS %I '
                 '(LIKE turns INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS)', name);
  EXECUTE format('ALTER TABLE turns ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', name, run, run + 1);
END $$;
"""

TRIGGER_FUNCTION = """
CREATE FUNCTION crucible_runs_turns_partition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM crucible_turns_partition(NEW.id);
  RETURN NULL;
END $$;
"""

TURN_COLUMNS = ("run_id, episode_id, index, token_ids, logprobs, loss_mask, prompt_length, completion_text, "
                "tool_call, observation, tool_output_full, exit_code, tool_status, duration_s, generation_s, "
                "truncated, truncated_bytes, weight_version, weight_version_end, replica, finish_reason, "
                "created_at")
"""Every stored column of turns (`search` is generated)."""


def _keys(table: str, *, foreign: bool) -> None:
    """The primary key and search index of turns (and before 0008 its foreign keys), on `table`."""
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_turns PRIMARY KEY (run_id, episode_id, index)")
    if foreign:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT fk_turns_run_id_runs FOREIGN KEY (run_id) "
                   "REFERENCES runs (id) ON DELETE CASCADE")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT fk_turns_episode_id_episodes FOREIGN KEY (episode_id) "
                   "REFERENCES episodes (id) ON DELETE CASCADE")
    op.execute(f"CREATE INDEX ix_turns_search ON {table} USING gin (search)")


def upgrade() -> None:
    op.add_column('runs', sa.Column('archived_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('runs', sa.Column('archive_path', sa.Text(), nullable=True))
    op.add_column('training_steps', sa.Column('points', postgresql.JSONB(astext_type=sa.Text()), nullable=True))

    op.execute("ALTER TABLE turns DROP CONSTRAINT fk_turns_run_id_runs")  # see PARTITION_FUNCTION
    op.execute("ALTER TABLE turns DROP CONSTRAINT fk_turns_episode_id_episodes")
    op.execute("ALTER TABLE turns RENAME TO turns_legacy")
    op.execute("ALTER INDEX pk_turns RENAME TO pk_turns_legacy")
    op.execute("ALTER INDEX ix_turns_search RENAME TO ix_turns_legacy_search")
    op.execute("CREATE TABLE turns (LIKE turns_legacy INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS) "
               "PARTITION BY RANGE (run_id)")
    _keys("turns", foreign=False)

    bind = op.get_bind()
    held = bind.execute(sa.text("SELECT EXISTS (SELECT 1 FROM turns_legacy)")).scalar_one()
    last_run = 0
    if held:
        last_run = int(bind.execute(sa.text("SELECT greatest(coalesce(max(id), 0), "
                                            "(SELECT coalesce(max(run_id), 0) FROM turns_legacy)) FROM runs"))
                       .scalar_one())
        op.execute(f"ALTER TABLE turns_legacy ADD CONSTRAINT turns_legacy_runs CHECK (run_id <= {last_run})")
        op.execute(f"ALTER TABLE turns ATTACH PARTITION turns_legacy FOR VALUES FROM (MINVALUE) TO ({last_run + 1})")
        op.execute("ALTER TABLE turns_legacy DROP CONSTRAINT turns_legacy_runs")  # the partition bound says it now
    else:
        op.execute("DROP TABLE turns_legacy")

    op.execute(PARTITION_FUNCTION.replace("{legacy_last_run}", str(last_run)))
    op.execute(TRIGGER_FUNCTION)
    op.execute("CREATE TRIGGER runs_turns_partition AFTER INSERT ON runs FOR EACH ROW "
               "EXECUTE FUNCTION crucible_runs_turns_partition()")
    op.execute("SELECT crucible_turns_partition(id) FROM runs ORDER BY id")  # no-op for the legacy ones


def downgrade() -> None:
    archived = op.get_bind().execute(sa.text("SELECT string_agg(id::text, ', ') FROM runs WHERE archived_at IS NOT NULL"))
    if (names := archived.scalar_one()) is not None:  # their turns are in Parquet files only
        raise RuntimeError(f"runs {names} are archived: `crucible runs restore` each before downgrading below 0008")
    op.execute("DROP TRIGGER runs_turns_partition ON runs")
    op.execute("DROP FUNCTION crucible_runs_turns_partition()")
    op.execute("DROP FUNCTION crucible_turns_partition(bigint)")
    op.execute("CREATE TABLE turns_plain (LIKE turns INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS)")
    op.execute(f"INSERT INTO turns_plain ({TURN_COLUMNS}) SELECT {TURN_COLUMNS} FROM turns")
    op.execute("DROP TABLE turns")  # and every partition
    op.execute("ALTER TABLE turns_plain RENAME TO turns")
    _keys("turns", foreign=True)

    op.drop_column('training_steps', 'points')
    op.drop_column('runs', 'archive_path')
    op.drop_column('runs', 'archived_at')
