"""The README's examples are real: the spec registers, the tasks import, the run config parses."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from controller.config import load_run_config
from environments.service import register_environment
from environments.spec import load_spec_file
from environments.tasks import import_tasks

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_examples_register_import_and_parse(db_session: Session) -> None:
    env, created = register_environment(db_session, spec=load_spec_file(EXAMPLES / "calc.yaml"))
    assert created and env.name == "calc"
    assert import_tasks(db_session, environment="calc", path=EXAMPLES / "tasks.jsonl") == 1
    config = load_run_config(EXAMPLES / "run.yaml")
    assert [share.name for share in config.environments] == ["calc"]


def test_the_browser_examples_register(db_session: Session) -> None:
    for name in ("miniwob", "shop"):
        env, created = register_environment(db_session, spec=load_spec_file(EXAMPLES / f"{name}.yaml"))
        assert created and env.kind == "browser"


def test_the_chat_and_read_number_examples_register_and_import(db_session: Session) -> None:
    for spec, tasks in (("chat.yaml", "chat.jsonl"), ("read-number.yaml", "read-number.jsonl")):
        env, created = register_environment(db_session, spec=load_spec_file(EXAMPLES / spec))
        assert created and env.kind in ("chat", "read_number")
        assert import_tasks(db_session, environment=env.name, path=EXAMPLES / tasks) == 3


def test_the_factory_example_registers(db_session: Session) -> None:
    env, created = register_environment(db_session, spec=load_spec_file(EXAMPLES / "factory-env.yaml"))
    assert created and env.kind == "code_repo" and env.spec["verifier"]["weights"] == {"hidden_tests": 1.0}


def test_the_openenv_examples_register_and_import(db_session: Session) -> None:
    for name in ("openenv-echo", "openenv-dipg"):
        env, created = register_environment(db_session, spec=load_spec_file(EXAMPLES / f"{name}.yaml"))
        assert created and env.kind == "openenv"
        assert import_tasks(db_session, environment=env.name, path=EXAMPLES / "openenv-echo.jsonl") == 3


def test_the_harbor_example_registers(db_session: Session) -> None:
    """Its task folder is imported by the `harbor` package in tests/environments/harbor/test_harbor_package.py."""
    env, created = register_environment(db_session, spec=load_spec_file(EXAMPLES / "harbor.yaml"))
    assert created and env.kind == "code_repo" and env.spec["task_images"] == ["crucible-harbor/*"]
    assert sorted(p.relative_to(EXAMPLES / "harbor").as_posix() for p in (EXAMPLES / "harbor").rglob("*") if p.is_file()) \
        == ["fix-calc/environment/Dockerfile", "fix-calc/environment/calc.py", "fix-calc/instruction.md",
            "fix-calc/solution/solve.sh", "fix-calc/task.toml", "fix-calc/tests/test.sh", "fix-calc/tests/test_outputs.py"]
