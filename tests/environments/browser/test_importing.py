"""Browser task import on the real Postgres: MiniWoB++ names × seeds, the shop's generator, browser JSONL;
counts, idempotent re-import, and every bad name, bound and format/kind mismatch refused before a row.

    .venv/bin/pytest -q -p no:cacheprovider tests/environments/browser/test_importing.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.errors import ConfigError, NotFound
from core.models import Task
from environments.browser.importing import MAX_TASKS
from environments.browser.sandbox.sites import shop
from environments.browser.task import BrowserTask, miniwob_names
from environments.service import register_environment
from environments.spec import parse_spec
from environments.tasks import import_generated, import_tasks

ROOT = Path(__file__).parents[3]
BROWSER = {"name": "web", "kind": "browser", "image": "browser", "sandbox": {"memory": "2g", "pids": 1024}}
CODE = {"name": "calc", "kind": "code_repo"}


@pytest.fixture
def web(db_session: Session) -> str:
    register_environment(db_session, spec=parse_spec(BROWSER))
    return "web"


def _rows(session: Session, environment: str = "web") -> dict[str, Task]:
    return {t.external_id: t for t in session.execute(select(Task).where(Task.environment_name == environment)).scalars()}


def _count(session: Session) -> int:
    return session.execute(select(func.count()).select_from(Task)).scalar_one()


def test_miniwob_names_times_seeds(db_session: Session, web: str) -> None:
    assert import_generated(db_session, environment=web, format="miniwob", tasks="click-button, enter-text",
                            seeds=3, seed_start=5) == 6
    rows = _rows(db_session)
    assert sorted(rows) == [f"miniwob/{name}/{seed}" for name in ("click-button", "enter-text") for seed in (5, 6, 7)]
    task = BrowserTask.model_validate(rows["miniwob/enter-text/6"].payload)
    assert (task.family, task.name, task.seed, task.navigation) == ("miniwob", "enter-text", 6, False)
    assert "enter-text" in rows["miniwob/enter-text/6"].instruction and rows["miniwob/enter-text/6"].split == "train"

    # Again, with a name repeated and another split: the same six rows, updated in place.
    ids = {key: row.id for key, row in rows.items()}
    assert import_generated(db_session, environment=web, format="miniwob", tasks="enter-text,click-button,enter-text",
                            seeds=3, seed_start=5, split="test") == 6
    db_session.expire_all()
    rows = _rows(db_session)
    assert {key: row.id for key, row in rows.items()} == ids and {row.split for row in rows.values()} == {"test"}


def test_all_miniwob_tasks_and_the_default_seeds(db_session: Session, web: str) -> None:
    names = miniwob_names()
    assert len(names) >= 100 and "click-button" in names
    assert import_generated(db_session, environment=web, format="miniwob", tasks="all") == len(names) * 10
    rows = _rows(db_session)
    assert len(rows) == len(names) * 10 and {f"miniwob/{n}/9" for n in names} <= set(rows)
    assert "miniwob/click-button/10" not in rows


def test_shop_tasks_are_the_generators(db_session: Session, web: str) -> None:
    assert import_generated(db_session, environment=web, format="shop", count=5000) == 5000
    rows = _rows(db_session)
    assert sorted(rows) == sorted(f"shop/{i}" for i in range(5000))
    for index in (0, 1, 5, 2718, 4999):
        expected = shop.generate_task(index)
        task = BrowserTask.model_validate(rows[f"shop/{index}"].payload)
        assert rows[f"shop/{index}"].instruction == expected["goal"] == task.goal
        assert (task.family, task.site, task.site_seed, task.check, task.navigation) == (
            "site", "shop", expected["site_seed"], expected["check"], True)
    assert len({row.instruction for row in rows.values()}) > 4900  # thousands of different goals

    # Again over the end of that range: the overlap is updated in place, the rest added.
    assert import_generated(db_session, environment=web, format="shop", count=10, start=4995, split="eval") == 10
    db_session.expire_all()
    ids = {key: row.id for key, row in rows.items()}
    rows = _rows(db_session)
    assert len(rows) == 5005 and all(rows[key].id == ids[key] for key in ids)
    assert [rows[f"shop/{i}"].split for i in (4994, 4995, 5004)] == ["train", "eval", "eval"]


@pytest.mark.parametrize(("format", "options", "message"), [
    ("miniwob", {"tasks": "click-buton"}, r"got 'click-buton' \(did you mean click-button.*`crucible tasks "
                                           r"miniwob-names` lists the \d+ known ones"),
    ("miniwob", {"tasks": "click-button,../../etc/passwd"}, r"got '\.\./\.\./etc/passwd'"),
    ("miniwob", {"tasks": ",".join(f"nope-{i}" for i in range(100_000))}, r"'nope-4' and 99995 more"),
    ("miniwob", {"tasks": ""}, r"tasks: expected 'all' or MiniWoB\+\+ names separated by commas, got ''"),
    ("miniwob", {"tasks": "click-button,,enter-text"}, r"names separated by commas"),
    ("miniwob", {"tasks": "ALL"}, r"got 'ALL'"),
    ("miniwob", {"seeds": 0}, r"seeds: expected an integer from 1 to 100000, got 0"),
    ("miniwob", {"seeds": -3}, r"seeds: expected an integer from 1 to 100000, got -3"),
    ("miniwob", {"seeds": 100_001}, r"seeds: .* got 100001"),
    ("miniwob", {"seeds": True}, r"seeds: .* got True"),
    ("miniwob", {"seeds": 2**80}, r"seeds: .* got 1208925819614629174706176"),
    ("miniwob", {"seed_start": -1}, r"seed_start: expected an integer from 0 to 2147483638, got -1"),
    ("miniwob", {"seeds": 2, "seed_start": 2**31 - 1}, r"seed_start: expected an integer from 0 to 2147483646"),
    ("miniwob", {"tasks": "all", "seeds": 100_000}, rf"expected at most {MAX_TASKS} tasks in one import, got \d+ × "
                                                    r"100000 = \d+"),
    ("miniwob", {"split": ""}, r"split: expected a name of 1 to 64 printable characters, got ''"),
    ("miniwob", {"split": "a\x1b[2Jb"}, r"split: expected .* got 'a\\x1b\[2Jb'"),
    ("miniwob", {"split": "s" * 65}, r"split: expected a name of 1 to 64"),
    ("miniwob", {"count": 5}, r"count: expected only tasks, seeds, seed_start with format miniwob, got count=5"),
    ("shop", {"tasks": "click-button", "count": 5}, r"tasks: expected only count, start with format shop"),
    ("shop", {}, r"count: expected how many shop tasks to generate \(1 to 100000\), got none"),
    ("shop", {"count": 0}, r"count: expected an integer from 1 to 100000, got 0"),
    ("shop", {"count": 100_001}, r"count: .* got 100001"),
    ("shop", {"count": 5, "start": -1}, r"start: expected an integer from 0 to \d+, got -1"),
    ("shop", {"count": 1, "start": 2**30}, r"shop/1073741824: payload.site_seed: Input should be less than or equal"),
    ("shop", {"count": 3, "split": " "}, r"split: expected"),
    ("wiki", {"count": 3}, r"format: expected crucible, miniwob, shop for 'web' \(a browser environment\), got 'wiki'"),
    ("swebench", {}, r"format: expected crucible, miniwob, shop for 'web' .* got 'swebench'"),
])
def test_bad_options_store_nothing(db_session: Session, web: str, format: str, options: dict[str, Any],
                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        import_generated(db_session, environment=web, format=format, **options)
    assert _count(db_session) == 0


def test_format_and_kind_must_match(db_session: Session, web: str, tmp_path: Path) -> None:
    register_environment(db_session, spec=parse_spec(CODE))
    with pytest.raises(ConfigError, match=r"format: expected crucible, swebench, harbor for 'calc' \(a code_repo environment\), "
                                          r"got 'miniwob'"):
        import_generated(db_session, environment="calc", format="miniwob", tasks="click-button", seeds=1)
    with pytest.raises(ConfigError, match=r"got 'shop'"):
        import_generated(db_session, environment="calc", format="shop", count=1)
    with pytest.raises(NotFound, match="no environment named 'nope'"):
        import_generated(db_session, environment="nope", format="miniwob")
    code_line = tmp_path / "code.jsonl"  # a code_repo task file given to a browser environment
    code_line.write_text(json.dumps({"id": "add", "instruction": "fix add", "repo": "repos/calc",
                                     "hidden_tests": {"paths": ["t.py"]}}) + "\n")
    with pytest.raises(ConfigError, match=r"code\.jsonl:1: expected only id, instruction, split and payload, got "
                                          r"\['hidden_tests', 'repo'\]"):
        import_tasks(db_session, environment=web, path=code_line)
    with pytest.raises(ConfigError, match=r"got 'swebench'"):
        import_tasks(db_session, environment=web, path=code_line, format="swebench")
    assert _count(db_session) == 0


def _write(path: Path, *lines: object) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_browser_jsonl(db_session: Session, web: str, tmp_path: Path) -> None:
    site = {"family": "site", "navigation": True, **shop.generate_task(7)}
    tasks = _write(tmp_path / "tasks.jsonl",
                   {"id": "mw-1", "payload": {"family": "miniwob", "name": "click-button", "seed": 4}},
                   "",
                   {"id": "shop-7", "split": "test", "payload": site},
                   {"id": "custom", "instruction": "Click it.", "payload": {"family": "miniwob", "name": "click-link"}})
    assert import_tasks(db_session, environment=web, path=tasks) == 3
    assert import_tasks(db_session, environment=web, path=tasks) == 3
    rows = _rows(db_session)
    assert sorted(rows) == ["custom", "mw-1", "shop-7"]
    assert "click-button" in rows["mw-1"].instruction and rows["mw-1"].split == "train"
    assert rows["shop-7"].instruction == site["goal"] and rows["shop-7"].split == "test"
    assert BrowserTask.model_validate(rows["shop-7"].payload).check == site["check"]
    assert rows["custom"].instruction == "Click it."


@pytest.mark.parametrize(("line", "message"), [
    ({"payload": {"family": "miniwob", "name": "click-button"}}, r":1: id: expected a non-empty string, got None"),
    ({"id": "", "payload": {"family": "miniwob", "name": "click-button"}}, r"id: expected a non-empty string"),
    ({"id": "x" * 257, "payload": {"family": "miniwob", "name": "click-button"}}, r"id: expected at most 256 characters"),
    ({"id": "x"}, r"payload: expected a browser task object like .*, got None"),
    ({"id": "x", "payload": "click-button"}, r"payload: expected a browser task object"),
    ({"id": "x", "payload": {"family": "miniwob", "name": "nope-nope"}}, r"payload: name: expected a "
                                                                          r"MiniWoB\+\+ task of the miniwob package"),
    ({"id": "x", "payload": {"family": "miniwob", "name": "click-button", "navigation": True}}, r"navigation: expected"),
    ({"id": "x", "payload": {"family": "miniwob", "name": "click-button", "seed": -1}}, r"payload\.seed: Input should "
                                                                                          r"be greater than or equal"),
    ({"id": "x", "payload": {"family": "site", "site": "shop", "goal": "Buy it."}}, r"goal and check: expected both"),
    ({"id": "x", "payload": {"family": "site", "site": "../shop", "goal": "g", "check": {"a": 1}}}, r"payload: site: expected one of shop, got '\.\./shop'"),
    ({"id": "x", "payload": {"family": "miniwob", "name": "click-button", "script": "alert(1)"}},
     r"payload\.script: Extra inputs are not permitted"),
    ({"id": "x", "payload": {"family": "miniwob", "name": "click-button"}, "instruction": 7}, r"instruction: expected"),
    ({"id": "x", "payload": {"family": "miniwob", "name": "click-button"}, "split": "a\nb"}, r"split: expected"),
    ("[1, 2]", r":1: expected a JSON object, got list"),
    ("{not json", r":1: expected one JSON object per line"),
])
def test_bad_browser_lines_name_the_line(db_session: Session, web: str, tmp_path: Path, line: object,
                                         message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        import_tasks(db_session, environment=web, path=_write(tmp_path / "tasks.jsonl", line))
    assert _count(db_session) == 0


def _crucible(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def test_the_cli_imports_and_refuses_in_one_line(db_session: Session, web: str, tmp_path: Path) -> None:
    db_session.commit()  # the CLI is another process
    ok = _crucible("tasks", "import", web, "--format", "miniwob", "--tasks", "click-button", "--seeds", "2", "-o", "json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"environment": "web", "imported": 2}
    ok = _crucible("tasks", "import", web, "--format", "shop", "--count", "3", "--start", "10", "--split", "eval")
    assert ok.returncode == 0 and "imported 3 tasks into web" in ok.stdout, ok.stderr
    assert sorted(_rows(db_session)) == ["miniwob/click-button/0", "miniwob/click-button/1", "shop/10", "shop/11",
                                         "shop/12"]
    names = _crucible("tasks", "miniwob-names", "-o", "json")
    assert json.loads(names.stdout) == list(miniwob_names())

    for args, message in [
        (["--format", "miniwob", "--tasks", "click-buton"], "did you mean click-button"),
        (["--format", "miniwob", "--seeds", "0"], "seeds: expected an integer from 1 to 100000, got 0"),
        (["--format", "shop"], "count: expected how many shop tasks to generate"),
        (["--format", "shop", "--count", "2", str(tmp_path / "t.jsonl")], "PATH: expected none with --format shop"),
        (["--format", "crucible"], "PATH: expected a JSONL task file for --format crucible, got none"),
        (["--format", "crucible", "--seeds", "3", str(tmp_path / "t.jsonl")], "--seeds: expected only with a generated"),
        (["--format", "wiki"], "--format: expected one of crucible, swebench, harbor, miniwob, shop, got 'wiki'"),
        ([str(tmp_path / "missing.jsonl")], "missing.jsonl: cannot read the task file"),
    ]:
        result = _crucible("tasks", "import", web, *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert message in lines[0], lines[0]
    db_session.expire_all()
    assert len(_rows(db_session)) == 5
