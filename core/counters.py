"""A run's episode and group counts from the ledgers Postgres keeps (`core.models.counts`, migration 0009):
a few dozen rows summed, whatever the size of the run, and always equal to counting the episodes.

    counts = run_counts(session, run_id=7)     # by (status, termination reason), by flag, groups by status
    fold(session, run_id=7)                    # the controller does this as the ledger grows

Nothing here writes a count: the triggers do, for every statement that touches episodes or groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import String, Table, func, select, text
from sqlalchemy.orm import Session

from core.models import RunEpisodeCounts, RunFlagCounts, RunGroupCounts

FOLD_AT = 256
"""Ledger rows a run may gather before `fold_if_long` compacts them."""
LEDGER_TABLES = (RunEpisodeCounts, RunFlagCounts, RunGroupCounts)
LEDGERS = tuple(ledger.name for ledger in LEDGER_TABLES)


@dataclass(frozen=True, kw_only=True)
class EpisodeCounts:
    """The run's episodes of one (status, termination reason)."""

    episodes: int
    rewarded: int
    """Episodes with a finite reward: the mean and spread are over these."""
    reward_sum: Decimal
    reward_squares: Decimal
    tokens: int
    turns: int
    flagged: int


@dataclass(frozen=True, kw_only=True)
class RunCounts:
    episodes: dict[tuple[str, str | None], EpisodeCounts] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)


def run_counts(session: Session, *, run_id: int) -> RunCounts:
    """The run's counts; keys whose count is zero are left out."""
    ledger = RunEpisodeCounts.c
    sums = [func.sum(ledger[name]) for name in ("episodes", "rewarded", "reward_sum", "reward_squares", "tokens",
                                                 "turns", "flagged")]
    rows = session.execute(
        select(ledger.status, ledger.termination_reason, *sums).where(ledger.run_id == run_id)
        .group_by(ledger.status, ledger.termination_reason).having(sums[0] != 0)
    )
    episodes = {
        (status, reason): EpisodeCounts(episodes=int(n), rewarded=int(rewarded), reward_sum=reward_sum,
                                        reward_squares=squares, tokens=int(tokens), turns=int(turns),
                                        flagged=int(flagged))
        for status, reason, n, rewarded, reward_sum, squares, tokens, turns, flagged in rows
    }
    flag_total = func.sum(RunFlagCounts.c.episodes)
    flags = session.execute(
        select(RunFlagCounts.c.flag, flag_total).where(RunFlagCounts.c.run_id == run_id)
        .group_by(RunFlagCounts.c.flag).having(flag_total != 0).order_by(RunFlagCounts.c.flag)
    )
    group_total = func.sum(RunGroupCounts.c.groups)
    groups = session.execute(
        select(RunGroupCounts.c.status, group_total).where(RunGroupCounts.c.run_id == run_id)
        .group_by(RunGroupCounts.c.status).having(group_total != 0)
    )
    return RunCounts(episodes=episodes, flags={str(flag): int(n) for flag, n in flags},
                     groups={str(status): int(n) for status, n in groups})


def _fold_statement(ledger: Table) -> str:
    """Replace `ledger`'s rows of run :run by their sums per key (run_id and the text columns), dropping
    keys whose every sum is zero."""
    keys = ["run_id", *(column.name for column in ledger.c if isinstance(column.type, String))]
    sums = [column.name for column in ledger.c if column.name not in keys]
    totals = [f"sum({name})" for name in sums]
    return (f"WITH gone AS (DELETE FROM {ledger.name} WHERE run_id = :run RETURNING *) "
            f"INSERT INTO {ledger.name} ({', '.join(keys + sums)}) "
            f"SELECT {', '.join(keys + totals)} FROM gone GROUP BY {', '.join(keys)} "
            f"HAVING {' OR '.join(f'{total} <> 0' for total in totals)}")


_FOLD = {ledger.name: _fold_statement(ledger) for ledger in LEDGER_TABLES}


def fold(session: Session, *, run_id: int) -> None:
    """Replace the run's ledger rows by their sums, one row per key (none for a key that sums to zero).
    Each statement deletes the rows it sums: rows appended meanwhile, or folded by a concurrent fold,
    are not in its snapshot and stay, so every change is counted exactly once. The run row is held
    (FOR KEY SHARE) until the caller commits, so a run deleted meanwhile waits for the fold and its
    ledger goes with it (the forget trigger would not see rows this fold inserted); commit soon."""
    if session.execute(text("SELECT 1 FROM runs WHERE id = :run FOR KEY SHARE"), {"run": run_id}).first() is None:
        return
    for statement in _FOLD.values():
        session.execute(text(statement), {"run": run_id})


def ledger_rows(session: Session, *, run_id: int) -> int:
    """The run's rows in all the ledgers (one statement: the controller asks every pass)."""
    counts = " + ".join(f"(SELECT count(*) FROM {table} WHERE run_id = :run)" for table in LEDGERS)
    return int(session.execute(text(f"SELECT {counts}"), {"run": run_id}).scalar_one())


def fold_if_long(session: Session, *, run_id: int) -> bool:
    """Fold the run's ledgers once they hold more than FOLD_AT rows (the controller, every pass)."""
    if ledger_rows(session, run_id=run_id) <= FOLD_AT:
        return False
    fold(session, run_id=run_id)
    return True
