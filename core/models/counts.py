"""Per-run episode counters, kept by Postgres itself (migration 0009): triggers on `episodes` append the
change every statement makes, so no code path (worker, controller, judge, trainer, a hand-written
UPDATE) can leave them wrong, and the run page reads a few dozen rows instead of every episode of the run.

The tables are append-only ledgers: a row is a signed change, and a run's figure is the SUM of its rows
(`core.counters`). Appending never waits on another writer (there is no shared row to lock); `fold`
replaces a run's rows by their sums so the ledger stays short.

`run_episode_counts` by (status, termination_reason): episodes; `rewarded`, those with a finite reward,
whose sum and sum of squares are kept exactly (numeric: a change and its reversal cancel to the last
digit); tokens; turns; `flagged`, those with at least one flag. `run_flag_counts`: flagged episodes by
flag. `run_group_counts`: groups by status.
"""

from sqlalchemy import BigInteger, Column, Index, Numeric, String, Table

from core.models.base import Base

RunEpisodeCounts = Table(
    "run_episode_counts", Base.metadata,
    Column("run_id", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("termination_reason", String(32)),
    Column("episodes", BigInteger, nullable=False),
    Column("rewarded", BigInteger, nullable=False),
    Column("reward_sum", Numeric, nullable=False),
    Column("reward_squares", Numeric, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("turns", BigInteger, nullable=False),
    Column("flagged", BigInteger, nullable=False),
    Index(None, "run_id"),
)

RunFlagCounts = Table(
    "run_flag_counts", Base.metadata,
    Column("run_id", BigInteger, nullable=False),
    Column("flag", String(32), nullable=False),
    Column("episodes", BigInteger, nullable=False),
    Index(None, "run_id"),
)

RunGroupCounts = Table(
    "run_group_counts", Base.metadata,
    Column("run_id", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("groups", BigInteger, nullable=False),
    Index(None, "run_id"),
)
