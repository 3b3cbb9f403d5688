"""(issue 24) A benchmark run without a configured database starts an embedded Postgres of its own under
a fresh temporary directory; it must leave neither the server nor the directory behind, also when
interrupted with Ctrl-C or terminated (SIGTERM: `kill`, a CI timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import signal, sys, time, psycopg
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (a background job's shell ignores it)
from sqlalchemy.engine import make_url
from bench.store import scratch_database
with scratch_database("leftover") as url:
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        print(conn.execute("SHOW data_directory").fetchone()[0], flush=True)
    if sys.argv[1] != "finished":
        time.sleep(600)
"""


def _postgres_processes(data_dir: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "postgres" in cmdline and data_dir in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.parametrize("how", ["finished", "interrupted", "terminated"])
def test_a_benchmarks_own_postgres_is_stopped_and_removed_when_it_exits(how: str) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CRUCIBLE_BENCH_DATABASE_URL", "CRUCIBLE_TEST_DATABASE_URL", "CRUCIBLE_DATABASE_URL")}
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, how], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    data_dir = process.stdout.readline().strip()
    assert data_dir.startswith("/") and "crucible-bench-pg-" in data_dir, (data_dir, process.stderr.read() if
                                                                           process.poll() is not None else "")
    assert _postgres_processes(data_dir), "the benchmark's embedded Postgres is running while it works"
    if how != "finished":
        time.sleep(0.5)
        process.send_signal(signal.SIGINT if how == "interrupted" else signal.SIGTERM)  # Ctrl-C, or `kill`
    process.wait(120)
    bench_root = data_dir.split("/postgres")[0]
    deadline = time.monotonic() + 30  # a postmaster's children exit just after it answers "stopped"
    while _postgres_processes(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _postgres_processes(data_dir) == []
    assert not Path(bench_root).exists(), bench_root
