"""The control plane's load while a fleet runs, counted, not computed: Postgres transactions and rows
written (pg_stat_database), broker messages (Redis LPUSH calls: Celery's sends and redeliveries), and the
API's latency under it (one reader polling a run's page)."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis
from sqlalchemy import text
from sqlalchemy.engine import Engine


def _database(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        row = connection.execute(text(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted AS rows FROM pg_stat_database "
            "WHERE datname = current_database()")).one()
    return {"commits": int(row.xact_commit), "rows": int(row.rows)}


def _pushes(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_lpush", "cmdstat_rpush"))


@dataclass
class ControlLoad:
    database: Engine
    broker_url: str
    api_url: str
    headers: dict[str, str]
    path: str
    latencies_ms: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> ControlLoad:
        self._broker = redis.Redis.from_url(self.broker_url)
        self._start = (time.monotonic(), _database(self.database), _pushes(self._broker))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        with httpx.Client(base_url=self.api_url, headers=self.headers, timeout=30) as client:
            while not self._stop.wait(0.5):
                started = time.perf_counter()
                if client.get(self.path).status_code == 200:
                    self.latencies_ms.append((time.perf_counter() - started) * 1000)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._reader.join(60)
        self._end = (time.monotonic(), _database(self.database), _pushes(self._broker))

    def figures(self) -> dict[str, Any]:
        (t0, db0, pushes0), (t1, db1, pushes1) = self._start, self._end
        seconds = t1 - t0
        ordered = sorted(self.latencies_ms)
        commits, rows, messages = db1["commits"] - db0["commits"], db1["rows"] - db0["rows"], pushes1 - pushes0
        return {
            "seconds": round(seconds, 1),
            "postgres_commits": commits, "postgres_commits_per_s": round(commits / seconds, 1),
            "postgres_rows_written": rows, "postgres_rows_written_per_s": round(rows / seconds, 1),
            "broker_messages": messages, "broker_messages_per_s": round(messages / seconds, 2),
            "api_requests": len(ordered),
            "api_p50_ms": round(statistics.median(ordered), 1) if ordered else None,
            "api_p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 1) if ordered else None,
        }
