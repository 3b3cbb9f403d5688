"""`crucible doctor` and the CLI's error boundary, run as a user would: a subprocess, real services."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

CRUCIBLE = [sys.executable, "-m", "cli.main"]


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CRUCIBLE + args, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=Path(__file__).parents[2])


def _clean_env(**extra: str) -> dict[str, str]:
    """The process environment without any CRUCIBLE_* setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    return {**env, **extra}


@pytest.fixture
def home() -> Iterator[Path]:
    """Not under pytest's basetemp: another pytest session starting on the machine puts /tmp/pytest-of-root
    back to mode 0700, and the embedded server's own user then cannot reach its data to stop it."""
    path = Path(tempfile.mkdtemp(prefix="crucible-doctor-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_with_no_settings_doctor_starts_the_embedded_postgres(home: Path) -> None:
    tmp_path = home
    env = _clean_env(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "share"))
    result = _run(["doctor", "-o", "json"], env)
    checks = {check["name"]: check for check in json.loads(result.stdout)}
    try:
        assert checks["database"]["ok"], checks["database"]
        assert checks["database"]["detail"].startswith("embedded Postgres, PostgreSQL ")
        assert checks["broker"]["ok"], checks["broker"]
        assert checks["broker"]["detail"] == "SQLAlchemy transport on the database"
        assert not checks["policy server"]["required"]
        assert (tmp_path / "share" / "crucible" / "postgres" / "PG_VERSION").exists()
        assert result.returncode == (0 if checks["docker engine"]["ok"] else 1)
    finally:
        stopped = _run(["db", "stop"], env)
        assert stopped.stdout.strip() == "stopped", stopped.stderr


def test_unreachable_database_is_one_line_and_fails(tmp_path: Path) -> None:
    env = _clean_env(CRUCIBLE_DATABASE_URL="postgresql://postgres@127.0.0.1:1/nowhere",
                     CRUCIBLE_DATA_DIR=str(tmp_path))
    result = _run(["db", "upgrade"], env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: CRUCIBLE_DATABASE_URL: cannot connect to postgresql+psycopg://postgres@127.0.0.1:1/nowhere")
    assert lines[0].endswith("expected a reachable PostgreSQL server")


def test_doctor_reports_an_unreachable_database_as_failure(tmp_path: Path) -> None:
    env = _clean_env(CRUCIBLE_DATABASE_URL="postgresql://postgres@127.0.0.1:1/nowhere",
                     CRUCIBLE_DATA_DIR=str(tmp_path))
    result = _run(["doctor", "-o", "json"], env)
    checks = {check["name"]: check for check in json.loads(result.stdout)}
    assert result.returncode == 1
    assert not checks["database"]["ok"] and checks["database"]["fix"]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CRUCIBLE_DATABASE_URL", "postgres//oops", "error: CRUCIBLE_DATABASE_URL: expected a URL like postgresql://user@host:5432/dbname, got 'postgres//oops'"),
        ("CRUCIBLE_WORKER_CONCURRENCY", "-4", "error: CRUCIBLE_WORKER_CONCURRENCY: Input should be greater than or equal to 1, got '-4'"),
        ("CRUCIBLE_SANDBOX_POOL_MAX", "0", "error: CRUCIBLE_SANDBOX_POOL_MAX: Input should be greater than or equal to 1, got '0'"),
    ],
)
def test_bad_settings_give_one_clear_line_and_no_trace(variable: str, value: str, message: str) -> None:
    result = _run(["doctor"], _clean_env(**{variable: value}))
    assert result.returncode == 2
    assert result.stderr.strip() == message
    assert result.stdout == ""


def test_doctor_shows_each_policy_replica(database_url: str) -> None:
    """CRUCIBLE_POLICY_URLS: one row per replica (none is running here: each is a warning, not a failure)."""
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    urls = ",".join(f"http://127.0.0.1:{port}/v1" for port in ports)
    result = _run(["doctor", "-o", "json"], _clean_env(CRUCIBLE_DATABASE_URL=database_url, CRUCIBLE_POLICY_URLS=urls))
    checks = {check["name"]: check for check in json.loads(result.stdout)}
    assert "policy server" not in checks
    for index, port in enumerate(ports, start=1):
        check = checks[f"policy replica {index}"]
        assert not check["ok"] and not check["required"]
        assert check["detail"].startswith(f"http://127.0.0.1:{port}/v1: ConnectError")
