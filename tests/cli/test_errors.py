"""Every CLI failure is one line (`--debug` for the traceback), as a user sees it: a subprocess.

A wrong database port used to print 150–180-line tracebacks from seven commands; spec files nested
deep, in UTF-16 or built as a billion laughs crashed or swelled it."""

from __future__ import annotations

import codecs
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
CRUCIBLE = [sys.executable, "-m", "cli.main"]
WRONG_PORT = "postgresql://postgres@127.0.0.1:1/crucible"


def _run(args: list[str], **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    env.update({f"CRUCIBLE_{key.upper()}": value for key, value in settings.items()})
    return subprocess.run(CRUCIBLE + args, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "ok.yaml").write_text("name: calc\nkind: code_repo\n")
    (tmp_path / "tasks.jsonl").write_text("{}\n")
    return tmp_path


@pytest.mark.parametrize("args", [
    ["env", "ls"], ["env", "show", "calc"], ["env", "register", "{dir}/ok.yaml"], ["tasks", "ls", "calc"],
    ["tasks", "import", "calc", "{dir}/tasks.jsonl"], ["token", "ls"], ["token", "create", "me"],
    ["token", "revoke", "me"], ["run", "ls"], ["run", "show", "1"], ["db", "upgrade"],
])
def test_a_wrong_database_port_is_one_line(spec_dir: Path, args: list[str]) -> None:
    result = _run([arg.format(dir=spec_dir) for arg in args], database_url=WRONG_PORT)
    line = _one_line_error(result)
    assert "port 1" in line or "does not answer" in line, line


def test_debug_shows_the_traceback(spec_dir: Path) -> None:
    result = _run(["--debug", "env", "ls"], database_url=WRONG_PORT)
    assert result.returncode != 0 and "Traceback" in result.stderr and "OperationalError" in result.stderr


@pytest.mark.parametrize(("content", "expected"), [
    ("name: calc\nkind: code_repo\nsandbox: {memory: lots}\n",
     'sandbox: memory: expected a size like "512m" or "2g", got "lots"'),
    ("name: calc\nkind: code_repo\nsandbox: {cpus: many}\n", "sandbox: cpus: expected a number, got \"many\""),
    ("name: calc\nkind: code_repo\nsandbox: {network: lab, allow_network: true}\n",
     "sandbox.network: expected a network the operator allows (none: CRUCIBLE_SANDBOX_NETWORKS is unset), got 'lab'"),
    ("name: calc\nkind: code_repo\nverifier: {judge: {url: 'http://169.254.169.254/v1', model: m, rubric: r}}\n",
     "verifier.judge.url: expected a policy server or one listed in CRUCIBLE_REWARD_SERVERS, got "
     "'http://169.254.169.254/v1'"),
    ("name: calc\nkind: code_repo\ndescription: " + "[" * 5000 + "]" * 5000 + "\n", "expected nesting at most 64 deep"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
     "expected YAML without anchors, got &a at line 1"),
    (b"\xff\xfe" + "name: caf\u00e9\nkind: code_repo\n".encode("utf-16-le"), "name: String should match pattern"),
    (b"name: \xff\xfe\n", "expected UTF-8 text, got a byte that is not"),
])
def test_a_bad_spec_file_is_one_line_naming_the_field(tmp_path: Path, content: str | bytes, expected: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = _run(["env", "register", str(path)], database_url=WRONG_PORT)  # refused before the database
    assert expected in _one_line_error(result)


def test_a_utf16_spec_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(codecs.BOM_UTF16_LE + "name: calc\nkind: code_repo\nsandbox: {memory: 1g}\n".encode("utf-16-le"))
    result = _run(["env", "register", str(path)], database_url=WRONG_PORT)
    assert "does not answer" in _one_line_error(result)  # parsed and valid: only the database is missing


def test_a_deep_json_spec_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{"name": "calc", "kind": "code_repo", "description": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "expected nesting at most 64 deep" in _one_line_error(_run(["env", "register", str(path)]))
