"""The house in numbers: what issue 49 asks of the code's shape, recomputed from the source, as one JSON object.

    .venv/bin/python -m scripts.house          # {"modules_over_400_lines": {"count": …, "where": […]}, …}

- modules over 400 lines (every package but tests; in-sandbox programs included);
- functions over 60 lines (outside migrations);
- kind names outside their own folder: a string literal naming a kind (environments.registry.KINDS) in a
  platform module (not recipes, bench or scripts, which use kinds as a user does, in specs they write)
  that is not the kind's own package nor the registry, once per line;
- reward arithmetic outside environments/rewards.py: an assignment or augmented assignment to a name or
  attribute called `reward` whose value is arithmetic (+, -, *, /).

Read from the source with `ast`, nothing imported but the registry; the targets (≤ 8, ≤ 6, only the
registry, only rewards.py) are the issue's, printed beside each count.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PACKAGES = ("api", "bench", "cli", "controller", "core", "environments", "migrations", "recipes", "sandboxes",
            "scripts", "task_workers", "trainer")
MODULE_LINES, FUNCTION_LINES = 400, 60


def sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def long_modules() -> list[str]:
    sized = [(len(path.read_text().splitlines()), rel(path)) for path in sources()]
    return [f"{where} ({lines})" for lines, where in sorted(sized, reverse=True) if lines > MODULE_LINES]


def long_functions() -> list[str]:
    found = []
    for path in sources():
        if rel(path).startswith("migrations/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > FUNCTION_LINES:
                    found.append((lines, f"{rel(path)}:{node.lineno} {node.name} ({lines})"))
    return [where for _, where in sorted(found, reverse=True)]


def kind_names_outside() -> list[str]:
    from environments.registry import KINDS

    found: list[str] = []
    for path in sources():
        where = rel(path)
        if where == "environments/registry.py" or where.split("/", 1)[0] in ("recipes", "bench", "scripts"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KINDS:
                line = f"{where}:{node.lineno} {node.value!r}"
                if not where.startswith(f"environments/{node.value}/") and line not in found:
                    found.append(line)
    return found


def reward_arithmetic_outside() -> list[str]:
    found = []
    for path in sources():
        where = rel(path)
        if where == "environments/rewards.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                targets, arithmetic = node.targets, any(isinstance(n, ast.BinOp) for n in ast.walk(node.value))
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, arithmetic = [node.target], any(isinstance(n, ast.BinOp) for n in ast.walk(node.value))
            elif isinstance(node, ast.AugAssign):
                targets, arithmetic = [node.target], True
            else:
                continue
            named = any((isinstance(t, ast.Name) and t.id == "reward") or
                        (isinstance(t, ast.Attribute) and t.attr == "reward") for t in targets)
            if named and arithmetic:
                found.append(f"{where}:{node.lineno}")
    return found


def main() -> None:
    report: dict[str, dict[str, object]] = {
        "modules_over_400_lines": {"target": "<= 8", "where": long_modules()},
        "functions_over_60_lines": {"target": "<= 6", "where": long_functions()},
        "kind_names_outside_their_folder": {"target": "0 (the registry only)", "where": kind_names_outside()},
        "reward_arithmetic_outside_rewards_py": {"target": "0", "where": reward_arithmetic_outside()},
    }
    for value in report.values():
        value["count"] = len(value["where"])  # type: ignore[arg-type]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
