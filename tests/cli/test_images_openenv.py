"""`crucible images openenv`, refused at the edge: each bad input is one line naming what was expected and what
was given, before pip or Docker is asked anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _refused(args: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    done = subprocess.run([sys.executable, "-m", "cli.main", "images", "openenv", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (["chess"], "expected one of echo, dipg (or --app with --requirement), got chess"),
    (["mine", "--app", "x:y"], "at least one --requirement"),
    (["mine", "other", "--app", "x:y", "-r", "a==1"], "expected one image name"),
    (["mine", "--app", "os.system('id'):x", "-r", "a==1"], "--app: expected module:attribute"),
    (["mine", "--app", "my_env.app:app", "-r", "evil @ https://example.com/evil.whl"], "--requirement"),
    (["mine", "--app", "my_env.app:app", "-r", "--index-url=http://127.0.0.1:9/simple"], "--requirement"),
])
def test_bad_input_is_one_line(args: list[str], expected: str) -> None:
    assert expected in _refused(args)
