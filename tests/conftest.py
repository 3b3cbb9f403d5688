"""Fixtures shared by every test, one of each per test session (per xdist worker under `-n`):

- a real, freshly migrated Postgres database. The server is the one in CRUCIBLE_TEST_DATABASE_URL (an
  admin URL; `make test` points it at the machine's Postgres when one answers), else an embedded
  Postgres started under a temp dir; each session (each xdist worker) gets its own database;
- the tiny model (`tiny_model_dir`, read-only) and one real vLLM server on a copy of it
  (`vllm_server`; `served_original` puts it back on the starting weights before a test that needs them);
- a Redis database index per xdist worker (CRUCIBLE_TEST_REDIS_URL's index − the worker's number).

Markers follow from the fixtures a test uses (`pytest_collection_modifyitems`): `docker`, `vllm`,
`browser`. Every test that uses a vLLM server is in xdist group "vllm", so one worker starts it once.

The fixtures more than one test folder uses are here, or in the plugins below (`pytest_plugins`: one
definition each for the whole suite): tests/support/sandbox_fixtures.py (dockerd, the images, the sandbox
providers) and tests/support/episode_fixtures.py (the scripted policy, the calc tasks, a Celery worker).
A folder's conftest.py keeps what only its own tests use.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from core.db import make_engine, reset_engines
from core.models import Base
from core.settings import get_settings
from core.versions import Label
from migrations import migrate

pytest_plugins = ("tests.support.sandbox_fixtures", "tests.support.episode_fixtures")


def _admin_url(embedded_root: Path) -> str:
    configured = os.environ.get("CRUCIBLE_TEST_DATABASE_URL")
    if configured:
        return configured
    from core.embedded import ensure_embedded_postgres

    return ensure_embedded_postgres(embedded_root)


def _psycopg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A new database on the test server, migrated to head; dropped after the session."""
    # Not under pytest's basetemp: concurrent pytest sessions rotate those directories away.
    embedded_root = Path(tempfile.mkdtemp(prefix="crucible-test-pg-"))
    admin = make_url(_admin_url(embedded_root))
    name = f"crucible_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_psycopg_dsn(str(admin.render_as_string(hide_password=False))), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    migrate.upgrade("head", url=url)
    yield url
    reset_engines()
    with psycopg.connect(_psycopg_dsn(str(admin.render_as_string(hide_password=False))), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if (embedded_root / "postgres").exists():
        from core.embedded import stop_embedded_postgres

        stop_embedded_postgres(embedded_root)
    shutil.rmtree(embedded_root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def crucible_settings(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Point every Crucible component under test at the test database and a temp data dir (its own,
    always: two sessions sharing one would share checkpoints of runs with the same ids)."""
    os.environ["CRUCIBLE_DATABASE_URL"] = database_url
    os.environ["CRUCIBLE_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


# The run counters' ledgers (migration 0009) are no models: TRUNCATE's trigger empties them, DELETE's
# subtract; emptied here by name either way.
COUNTER_TABLES = ("run_episode_counts", "run_flag_counts", "run_group_counts")


@pytest.fixture(scope="session")
def emptying_sql(engine: Engine) -> str:
    """What empties every table and restarts every id sequence, as TRUNCATE … RESTART IDENTITY would.
    DELETE, children first: the tables hold a test's few rows, and TRUNCATE's new files for 18 tables
    cost ~60 ms a test against ~8 ms (measured on this machine's Postgres)."""
    tables = [table.name for table in Base.metadata.sorted_tables]
    with engine.connect() as conn:
        sequences = conn.execute(text(
            "SELECT s.oid::regclass::text FROM pg_class s JOIN pg_depend d ON d.objid = s.oid "
            "JOIN pg_class t ON d.refobjid = t.oid WHERE s.relkind = 'S' AND t.relname = ANY(:tables)"),
            {"tables": tables}).scalars().all()
    statements = [f'DELETE FROM "{name}"' for name in [*reversed(tables), *COUNTER_TABLES]]
    statements += [f"ALTER SEQUENCE {sequence} RESTART" for sequence in sequences]
    # Celery's messages (the SQLAlchemy transport's table, made by the first worker that connects): a
    # message a test left would run in a later test, on the episode that reuses its id.
    statements.append("DO $$ BEGIN IF to_regclass('kombu_message') IS NOT NULL THEN DELETE FROM kombu_message; "
                      "END IF; END $$")
    return "; ".join(statements)


@pytest.fixture
def db_session(engine: Engine, emptying_sql: str) -> Iterator[Session]:
    """A session on the test database; every table is emptied and every id restarted after the test."""
    with Session(engine, expire_on_commit=False) as session:
        yield session
    with engine.begin() as conn:
        conn.exec_driver_sql(emptying_sql)


# -- one tiny model and one vLLM server per session ---------------------------------------------------

# What a real model ships (Qwen: top_k 20, repetition penalty 1.05), made hostile: a server that applied
# any of it would sample from a distribution the trainer does not compute, and every test that matches
# vLLM's logprobs to the trainer's would fail.
HOSTILE_GENERATION_CONFIG = {"do_sample": True, "temperature": 0.3, "top_k": 3, "top_p": 0.5, "min_p": 0.2,
                             "repetition_penalty": 1.5}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly made tiny model (seed 0, default spec). Read-only: copy it before changing it."""
    from trainer.tiny_model import make_tiny_model

    return make_tiny_model(out_dir=tmp_path_factory.mktemp("tiny") / "model", seed=0).path


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def served_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny model for the server (weight sync rewrites its safetensors), with hostile
    generation defaults (HOSTILE_GENERATION_CONFIG) that the server must ignore."""
    import json

    served = Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("served") / "model"))
    config = json.loads((served / "generation_config.json").read_text())
    (served / "generation_config.json").write_text(json.dumps({**config, **HOSTILE_GENERATION_CONFIG}))
    return served


@pytest.fixture(scope="session")
def vllm_server(served_model_dir: Path) -> Iterator[Any]:
    """The session's real vLLM server (float32, eager) on a free port: the policy of every test that
    needs a live one, and the judge of the judge tests. Started once, always stopped. Tests that push
    weights put the starting ones back (`served_original`) or restore them themselves."""
    from trainer.serving import VllmServer, group_members

    log_path = served_model_dir.parent / "server.log"
    # A generous start-up limit: on 2 shared cores under load vLLM has been seen to need > 240 s.
    with VllmServer(model_dir=served_model_dir, served_model_name="tiny", max_model_len=4096,
                    log_path=log_path, startup_timeout_s=600) as server:
        yield server
    assert server.pid is not None and group_members(server.pid) == [], "vLLM processes outlived stop()"


@pytest.fixture
def served_original(vllm_server: Any, tiny_model_dir: Path) -> Any:
    """The session's server, put back on the tiny model's starting weights and tagged version 0 (a test
    before may have trained and synced)."""
    from transformers import AutoModelForCausalLM

    from trainer.weight_sync import make_weight_syncer

    syncer = make_weight_syncer("reload", base_url=vllm_server.base_url, model_dir=vllm_server.model_dir)
    syncer.push(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), label=Label.fresh(0, run=None))
    syncer.close()
    return vllm_server


# -- markers from fixtures; the vLLM tests on one xdist worker ------------------------------------------

FIXTURE_MARKS = {
    "docker": {"backend", "sandbox_images", "code_repo_image", "sandboxes", "module_sandboxes", "docker_backend",
               "repo_spec"},
    "vllm": {"vllm_server", "served_original"},
    "browser": {"browser", "page", "driver", "browser_sandbox"},
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for mark, fixtures in FIXTURE_MARKS.items():
            if used & fixtures and item.get_closest_marker(mark) is None:
                item.add_marker(getattr(pytest.mark, mark))
        if item.get_closest_marker("xdist_group") is None:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(pytest.mark.xdist_group("vllm"))
            elif _uses_a_module_fixture(item):  # made once per module and worker: its users on one worker
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
        _set_node_id(item, loadgroup=getattr(config.option, "loadgroup", False))


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


def _set_node_id(item: pytest.Item, *, loadgroup: bool) -> None:
    """The node id xdist schedules and reports by, written where pytest 9 reads it (`item._id`):
    - schemathesis gives each operation's item its function's node id (the operation is only in the
      item's name); xdist keys results by node id, so 27 operations would count as one: each gets its own;
    - under `--dist loadgroup` the id ends in `@group`, and the tests of one group run on one worker. xdist
      3.8 writes that suffix to `item._nodeid`, which pytest 9 no longer reads, so without this every
      grouped test was scheduled alone."""
    if item.parent is None:
        return
    name = item.name
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")}) if loadgroup else []
    if names and "@" not in name:
        name = f"{name}@{'_'.join(names)}"
    if item.nodeid != item.parent.id.child(name):
        item._id = item.parent.id.child(name)  # what Node.__init__ gives an item of that name


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, worker gwN uses Redis database index base − N (the base from CRUCIBLE_TEST_REDIS_URL,
    15 by default: counting down keeps clear of index 0, where a developer's own data is)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker:
        # xdist starts its workers with COLUMNS=80: a rich Console made under it keeps that width for
        # good, and the CLI tests' own COLUMNS would not reach it. A worker runs tests as one process does.
        os.environ.pop("COLUMNS", None)
    url = os.environ.get("CRUCIBLE_TEST_REDIS_URL")
    if url and worker.startswith("gw"):
        base, _, index = url.rpartition("/")
        number = int(index) if index.isdigit() else 0
        os.environ["CRUCIBLE_TEST_REDIS_URL"] = f"{base}/{(number - int(worker[2:])) % 16}"
