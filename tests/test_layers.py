"""The package structure from the imports: each top-level package imports only what shared/ARCHITECTURE.md's
package table lets it, and nothing outside tests imports tests. Read from the source (every import
statement, function-level ones included), so an import added anywhere is seen.

And tests/ mirrors the source tree: each folder tests/a/b names the package a.b, and each test file in
tests/a/… imports something of package a (the exceptions are named below, each with why)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("core", "migrations", "sandboxes", "environments", "task_workers", "controller", "trainer", "api", "cli",
        "recipes", "bench", "scripts", "tests")
EVERYTHING_BUT_TESTS = frozenset(OURS) - {"tests"}

MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "migrations": frozenset({"core"}),
    "sandboxes": frozenset({"core"}),
    "environments": frozenset({"core", "sandboxes"}),
    "task_workers": frozenset({"core", "sandboxes", "environments"}),
    "controller": frozenset({"core", "environments", "task_workers"}),
    "trainer": frozenset({"core", "environments.rewards"}),  # a package, or one module of it
    "api": frozenset({"core", "sandboxes", "environments", "task_workers", "controller", "trainer"}),
    "cli": EVERYTHING_BUT_TESTS,
    "recipes": EVERYTHING_BUT_TESTS,
    "bench": EVERYTHING_BUT_TESTS,
    "scripts": EVERYTHING_BUT_TESTS,
}

# Imports the design does not allow yet, each with why it is still here; the test fails on any other,
# and on an entry that is no longer needed (so this list only shrinks). Empty: the code is the design.
DEPARTURES: dict[tuple[str, str], str] = {}


def imports(path: Path) -> set[str]:
    """Every absolute module an import statement in `path` names (`from a.b import c` → a.b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def edges(root: Path = ROOT) -> dict[tuple[str, str], str]:
    """{(file, module): package of the module} for every import of another of our packages."""
    found = {}
    for package in MAY_IMPORT:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for module in imports(path):
                top = module.split(".", 1)[0]
                if top in OURS and top != package:
                    found[(rel, module)] = top
    return found


def not_allowed(found: dict[tuple[str, str], str]) -> list[str]:
    return sorted(f"{rel} imports {module}" for (rel, module), top in found.items()
                  if not allowed(rel, module) and (rel, module) not in DEPARTURES)


def allowed(rel: str, module: str) -> bool:
    """`module` is in a package, or is (or is inside) a module, that the file's package may import."""
    return any(module == name or module.startswith(name + ".") for name in MAY_IMPORT[rel.split("/", 1)[0]])


def test_each_package_imports_only_what_the_design_allows() -> None:
    found = edges()
    wrong = not_allowed(found)
    assert not wrong, "imports the package table of shared/ARCHITECTURE.md does not allow:\n" + "\n".join(wrong)
    stale = sorted(f"{rel} → {module}" for rel, module in DEPARTURES if (rel, module) not in found)
    assert not stale, "departures no longer needed (remove them from DEPARTURES):\n" + "\n".join(stale)


@pytest.mark.parametrize(("path", "source"), [
    ("environments/kind.py", "from task_workers.episode.runner import run_episode"),
    ("core/db.py", "def upgrade():\n    import migrations.migrate"),  # inside a function
    ("sandboxes/pool.py", "import environments.base as base"),
    ("api/routes/x.py", "from tests.support import factories"),
    ("recipes/demo.py", "from tests.support.processes import stop"),  # recipes: everything but tests
    ("trainer/step.py", "from api.deps import current_token"),  # a departure of another file is no licence
    ("trainer/rollouts.py", "from environments.spec import VerifierConfig"),  # environments.rewards only
    ("trainer/step.py", "import environments.rewards_extra"),  # a name that only starts like the module
])
def test_an_import_against_the_design_is_caught(tmp_path: Path, path: str, source: str) -> None:
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    target.write_text(source + "\n")
    assert not_allowed(edges(tmp_path)) == [f"{path} imports {next(iter(imports(target)))}"]


def test_lint_type_checks_every_package() -> None:
    """`make lint` (run by `make test`) type-checks what [tool.mypy] files lists: every package but tests."""
    import tomllib

    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert sorted(files) == sorted(EVERYTHING_BUT_TESTS)
    assert "make lint" in (ROOT / "scripts" / "test.sh").read_text()


# -- the tests mirror the source tree --------------------------------------------------------------------

# Folders of tests/ that name no package of ours, each with why (their subfolders are theirs too).
NOT_A_PACKAGE: dict[str, str] = {
    "support": "helpers and the fixture plugins shared by every folder (tests/conftest.py loads the plugins)",
    "data": "files the tests read (chat templates); no tests",
    "dashboard": "api.dashboard's pages in a real browser: apart from tests/api so that its live server and "
                 "Chromium fixtures stay out of the API tests",
    "fleet": "several hosts on one machine (network namespaces, an engine each): the whole platform across "
             "hosts, no one package; `make test-fleet`",
    "compose": "compose.yaml brought up by docker-compose: the whole platform in containers, no one package; "
               "`make test-compose`",
}

# Folders whose tests drive their package from outside, as a user does, so most of them import nothing of it.
DRIVEN_FROM_OUTSIDE: dict[str, str] = {
    "api": "through the app's HTTP client (the `client` fixture) or a live server",
    "cli": "through the `crucible` console script in a child process, or Typer's runner",
}

# Test files that import nothing of the package their folder names, each with why. The test fails on any
# other, and on an entry that is no longer needed (so this list only shrinks).
STRANGERS: dict[str, str] = {
    "bench/test_scratch_database.py": "bench.store runs in a child process, which the test interrupts",
    "recipes/test_interrupts.py": "each recipe runs in a child process, which the test interrupts",
    "sandboxes/test_sandbox_cli.py": "`crucible sandbox` (cli.sandbox), beside the sandbox tests for their "
                                     "session's no-leak check (tests/sandboxes/conftest.py, CLI_ENV_LABEL)",
    "task_workers/test_openenv_serve.py": "task_workers.openenv_server, run as `crucible env serve` in a child process",
    "task_workers/test_openenv_serve_refusals.py": "task_workers.openenv_server's refusals, through `crucible env "
                                                   "serve` (cli.main)",
    "task_workers/episode/test_no_secret_in_logs.py": "the worker, controller and API as `crucible` processes",
}


def unmirrored_folders(root: Path = ROOT) -> list[str]:
    """Every folder tests/a/b (below the exceptions) whose a.b is no package or module of ours."""
    wrong = []
    for folder in sorted(p for p in (root / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"):
        parts = folder.relative_to(root / "tests").parts
        if parts[0] in NOT_A_PACKAGE:
            continue
        source = root.joinpath(*parts)
        if parts[0] not in EVERYTHING_BUT_TESTS or not ((source / "__init__.py").exists()
                                                         or source.with_suffix(".py").exists()):
            wrong.append(f"tests/{'/'.join(parts)} names no package of ours ({'.'.join(parts)})")
    return wrong


def strangers(root: Path = ROOT) -> list[str]:
    """Every test file in tests/<package>/… (below the exceptions) that imports no module of <package>."""
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = path.relative_to(root / "tests")
        package = rel.parts[0]
        if len(rel.parts) == 1 or package in NOT_A_PACKAGE or package in DRIVEN_FROM_OUTSIDE:
            continue  # tests/test_*.py: the whole code base's
        if not any(module == package or module.startswith(package + ".") for module in imports(path)):
            found.append(rel.as_posix())
    return found


def test_each_test_folder_names_a_package_of_ours() -> None:
    wrong = unmirrored_folders()
    assert not wrong, "tests/ mirrors the source tree; move these, or name them in NOT_A_PACKAGE with why:\n" + \
        "\n".join(wrong)
    for name in [*NOT_A_PACKAGE, *DRIVEN_FROM_OUTSIDE]:
        assert (ROOT / "tests" / name).is_dir(), f"tests/{name} is gone: drop it from the exceptions"
    named = sorted(name for name in NOT_A_PACKAGE if (ROOT / name / "__init__.py").exists())
    assert not named, f"these name packages now (remove them from NOT_A_PACKAGE): {named}"


def test_each_test_file_imports_the_package_its_folder_names() -> None:
    found = strangers()
    wrong = sorted(set(found) - set(STRANGERS))
    assert not wrong, ("test files that import nothing of their folder's package: move each to the folder of what "
                       "it tests, or name it in STRANGERS with why:\n" + "\n".join(wrong))
    stale = sorted(set(STRANGERS) - set(found))
    assert not stale, "no longer needed (remove them from STRANGERS):\n" + "\n".join(stale)


@pytest.mark.parametrize(("path", "source", "found"), [
    ("tests/sandboxes/test_pool.py", "from sandboxes.pool import SandboxPool", ([], [])),
    ("tests/sandboxes/test_pool.py", "from environments.spec import parse_spec", ([], ["sandboxes/test_pool.py"])),
    ("tests/environments/code_repo/test_x.py", "import environments.code_repo.grader", ([], [])),
    ("tests/environments/code_repo/test_x.py", "from environments.parsing import hermes_call", ([], [])),  # the package's
    ("tests/environments/nowhere/test_x.py", "import environments",
     (["tests/environments/nowhere names no package of ours (environments.nowhere)"], [])),
    ("tests/task_workers/sandbox/test_x.py", "import sandboxes",
     (["tests/task_workers/sandbox names no package of ours (task_workers.sandbox)"], ["task_workers/sandbox/test_x.py"])),
    ("tests/misc/test_x.py", "import core", (["tests/misc names no package of ours (misc)"], ["misc/test_x.py"])),
    ("tests/support/test_x.py", "import os", ([], [])),  # an exception
    ("tests/api/test_x.py", "import httpx", ([], [])),  # driven from outside
    ("tests/test_x.py", "import os", ([], [])),  # the whole code base's
], ids=["its-package", "another-package", "its-subpackage", "its-top-package", "no-such-subpackage",
        "the-old-sandbox-folder", "no-such-package", "support", "api", "top-level"])
def test_a_misplaced_test_is_caught(tmp_path: Path, path: str, source: str,
                                    found: tuple[list[str], list[str]]) -> None:
    for package in ("sandboxes", "environments", "environments/code_repo", "task_workers", "api"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    target = tmp_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source + "\n")
    assert (unmirrored_folders(tmp_path), strangers(tmp_path)) == found
