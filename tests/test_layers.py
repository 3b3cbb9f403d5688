"""The package structure from the imports: each top-level package imports only what shared/ARCHITECTURE.md's
package table lets it, and nothing outside tests imports tests. Read from the source (every import
statement, function-level ones included), so an import added anywhere is seen."""

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
