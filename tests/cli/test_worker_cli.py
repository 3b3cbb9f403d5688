"""(issue 24) `crucible worker` with a dead broker or database: one line naming it and exit 2, not Celery's
banner and a hundred connection retries."""

from __future__ import annotations

import subprocess

import pytest

from tests.api.live_server import ROOT, crucible_command, crucible_env


@pytest.mark.parametrize(("settings", "expected"), [
    ({"broker_url": "redis://127.0.0.1:1/0"}, "error: broker: cannot reach redis://127.0.0.1:1/0: "),
    ({"broker_url": "amqp://guest:guest-pw-x@127.0.0.1:1//"}, "error: broker: cannot reach amqp://***@127.0.0.1:1//: "),
    ({"database_url": "postgresql+psycopg://postgres@127.0.0.1:1/none"}, "error: database: "),
])
def test_a_worker_without_its_broker_or_database_says_so_in_one_line(settings: dict[str, str], expected: str) -> None:
    result = subprocess.run(crucible_command("worker", "-Q", "code_repo"), cwd=ROOT, env=crucible_env(**settings),
                            capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert (result.returncode, len(lines)) == (2, 1), (result.returncode, result.stderr[-2000:])
    assert lines[0].startswith(expected), lines
    assert "guest-pw-x" not in result.stdout + result.stderr
