"""Environment specs: validation with readable errors, versioned registration, task import."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.errors import ConfigError, NotFound
from core.models import Task
from environments.code_repo.task import CodeRepoTask
from environments.service import get_environment, list_environments, register_environment
from environments.spec import load_spec_file, parse_spec
from environments.tasks import import_tasks

SPEC = {"name": "calc", "kind": "code_repo", "limits": {"max_turns": 8}}


def test_bad_specs_say_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kind: expected one of [a-z_, ]*code_repo[a-z_, ]*, got .vm."):
        parse_spec({**SPEC, "kind": "vm"})
    with pytest.raises(ConfigError, match=r"limits\.max_turns: Input should be greater than or equal to 1 \(got -2\)"):
        parse_spec({**SPEC, "limits": {"max_turns": -2}})
    with pytest.raises(ConfigError, match=r"limits\.turns: Extra inputs are not permitted"):
        parse_spec({**SPEC, "limits": {"turns": 3}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match=r"bad\.yaml: expected valid YAML"):
        load_spec_file(bad)
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read the spec file"):
        load_spec_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize("kind", ["code_repo", "browser", "chat", "read_number"])
@pytest.mark.parametrize("tools", [["../../bin/sh"], ["bash", "bash"], [], ["BASH"], ["bash\u0000"], ["submit "]])
def test_tools_outside_the_kinds_are_refused_at_registration(kind: str, tools: list[str]) -> None:
    """(issue 24) A spec's `tools` picks from its kind's own: anything else (a path, a twin, an empty
    list that would offer nothing, a near-spelling) is refused when registered, not at the first episode."""
    spec = {**SPEC, "kind": kind, **({"verifier": {"judge": {"url": "http://127.0.0.1:9/v1", "model": "j", "rubric": "Is it kind?"}}}
                                     if kind == "chat" else {})}
    with pytest.raises(ConfigError, match=rf"tools: expected distinct names among .* \(kind {kind}\), got "):
        parse_spec({**spec, "tools": tools})


def test_a_subset_of_the_kinds_tools_is_registered_and_offered_in_its_order() -> None:
    from environments.registry import get_kind, kind_tools

    assert kind_tools("code_repo")[:1] == ["bash"]
    spec = parse_spec({**SPEC, "tools": ["submit", "bash"]})
    offered = [schema["function"]["name"] for schema in get_kind("code_repo")(spec).tools()]
    assert offered == ["submit", "bash"]


def test_registration_is_versioned_and_idempotent(db_session: Session) -> None:
    first, created = register_environment(db_session, spec=parse_spec(SPEC))
    again, created_again = register_environment(db_session, spec=parse_spec(SPEC))
    changed, created_changed = register_environment(db_session, spec=parse_spec({**SPEC, "description": "v2"}))
    assert (created, created_again, created_changed) == (True, False, True)
    assert (first.version, again.version, changed.version) == (1, 1, 2)
    assert get_environment(db_session, name="calc").version == 2
    assert get_environment(db_session, name="calc", version=1).spec["description"] == ""
    assert [row.version for row in list_environments(db_session)] == [2]
    with pytest.raises(NotFound, match="no version 7 of environment named 'calc'"):
        get_environment(db_session, name="calc", version=7)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_import_crucible_and_swebench_tasks(db_session: Session, tmp_path: Path) -> None:
    register_environment(db_session, spec=parse_spec(SPEC))
    repo = tmp_path / "repos" / "calc"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    hidden = {"paths": ["test_hidden.py"],
              "files": {"test_hidden.py": "from calc import add\ndef test():\n    assert add(2, 2) == 4\n"}}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "add", "instruction": "fix add", "repo": "repos/calc",
                                 "hidden_tests": hidden}) + "\n")
    assert import_tasks(db_session, environment="calc", path=tasks) == 1
    assert import_tasks(db_session, environment="calc", path=tasks) == 1  # an update, not a copy

    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    instance = {"instance_id": "calc-1", "repo": "acme/calc", "base_commit": base, "problem_statement": "add is wrong",
                "test_patch": "", "FAIL_TO_PASS": json.dumps(["test_hidden.py::test"]), "PASS_TO_PASS": "[]"}
    (tmp_path / "repos" / "acme__calc").symlink_to(repo)
    swe = tmp_path / "swe.jsonl"
    swe.write_text(json.dumps(instance) + "\n")
    assert import_tasks(db_session, environment="calc", path=swe, format="swebench", repos_dir=tmp_path / "repos") == 1
    rows = {t.external_id: t for t in db_session.execute(select(Task)).scalars()}
    assert set(rows) == {"add", "calc-1"}
    assert CodeRepoTask.model_validate(rows["add"].payload).repo.format == "tar"
    swe_task = CodeRepoTask.model_validate(rows["calc-1"].payload)
    assert swe_task.repo.format == "git_bundle"
    assert swe_task.hidden_tests.tests == ["test_hidden.py::test"]


def test_import_errors_name_the_line(db_session: Session, tmp_path: Path) -> None:
    register_environment(db_session, spec=parse_spec(SPEC))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "x", "instruction": "i", "repo": "."}\nnot json\n')
    with pytest.raises(ConfigError, match=r"tasks\.jsonl:1: expected a 'hidden_tests' field"):
        import_tasks(db_session, environment="calc", path=tasks)
    with pytest.raises(NotFound, match="no environment named 'nope'"):
        import_tasks(db_session, environment="nope", path=tasks)


def test_specs_stored_before_kinds_owned_their_sections_parse_to_the_same_hash() -> None:
    """Dumps made at a97b139, when every spec carried a `browser` and an `openenv` field (null for the other
    kinds): they parse, and keep the content hash runs pinned them by."""
    stored = json.loads((Path(__file__).parent / "stored_specs.json").read_text())
    for name, record in stored.items():
        spec = parse_spec(record["dump"])
        assert spec.content_hash() == record["content_hash"], name
        assert parse_spec(spec.model_dump(mode="json")).content_hash() == record["content_hash"], name
    assert parse_spec(stored["browser"]["dump"]).kind_config.viewport == (640, 480)
    with pytest.raises(ConfigError, match="openenv: expected this section only for kind openenv, got kind 'browser'"):
        parse_spec({**stored["browser"]["dump"], "openenv": stored["openenv"]["dump"]["openenv"]})
