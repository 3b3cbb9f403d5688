"""The names other code and people read have one definition each, and every reader uses it:

- metric names (`trainer.metrics`: constants and FAMILIES; `trainer.cost`): every metric-like string in
  the code and the dashboard's scripts is a name the trainer writes, so a rename that misses a reader
  (the demo, the run page, the seeded store) fails here instead of showing an empty column;
- the step's timing stages (`trainer.metrics.STAGES`) and the cost stages (`trainer.cost.STAGES`; the run
  page is given them by the API's /v1/metric-names);
- the trainer's crash points (`trainer.faults.POINTS`): each is passed in a step, none other is named;
- run purposes and difficulty buckets (`core.termination.RunPurpose`, `Bucket`), and the hack monitors' flags
  (`core.flags.EpisodeFlag`). The reward rules have
  their own test (tests/environments/test_rewards.py).
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer import cost, faults, metrics

ROOT = Path(__file__).resolve().parents[1]
CODE = ("api", "cli", "controller", "core", "task_workers", "trainer", "recipes", "scripts", "bench", "environments",
        "sandboxes")
AREAS = ("loss", "optim", "policy", "canary", "mismatch", "reward", "batch", "rollout", "throughput", "sync",
         "timing_s", "reward_hacking", "cost", "score", "advantage")
METRIC_LIKE = re.compile(rf"(?:{'|'.join(AREAS)})(?:/[A-Za-z0-9_.{{}}-]+)+/?")
PLACEHOLDER = re.compile(r"\{[^}]*\}")


def _python_strings(path: Path) -> Iterator[tuple[int, str]]:
    """Every string constant, and every f-string with its replacement fields written `{}`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inside_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstrings:
            yield node.lineno, node.value
            for quoted in re.findall(r"'([^'\s]+)'", node.value):  # names inside SQL: jsonb_build_object('…', …)
                yield node.lineno, quoted


def _script_strings(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for match in re.finditer(r"([\"'`])((?:(?!\1).)*)\1", line):
            yield number, re.sub(r"\$\{[^}]*\}", "{}", match.group(2))


def _metric_strings() -> Iterator[tuple[str, str]]:
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, value in _python_strings(path):
                if METRIC_LIKE.fullmatch(value):
                    yield f"{path.relative_to(ROOT)}:{line}", value
    for path in sorted((ROOT / "api" / "dashboard" / "static").glob("*.js")):
        for line, value in _script_strings(path):
            if METRIC_LIKE.fullmatch(value):
                yield f"{path.relative_to(ROOT)}:{line}", value


def _declared(value: str) -> bool:
    """A name the trainer writes; a template (`{}` fields) that some written name fills; a prefix of one."""
    shapes = [PLACEHOLDER.sub("{}", family) for family in metrics.FAMILIES] + sorted(metrics.fixed_names())
    value = PLACEHOLDER.sub("{}", value)  # "{env}", an f-string's field and a template literal's alike
    if value.endswith("/"):
        return any(PLACEHOLDER.sub("{}", shape).startswith(value) for shape in shapes)
    if "{" not in value:
        return metrics.is_metric_name(value)
    pattern = re.compile("/".join("[^/]+" if part == "{}" else re.escape(part) for part in value.split("/")))
    stages = [f"timing_s/{stage}" for stage in metrics.STAGES]
    return any(pattern.fullmatch(shape) for shape in shapes + stages)


def test_every_metric_name_in_the_code_is_one_the_trainer_writes() -> None:
    found = list(_metric_strings())
    assert len(found) > 40, "the scan found too few metric names to be looking in the right places"
    unknown = [f"{where}: {value!r}" for where, value in found if not _declared(value)]
    assert unknown == [], "not a metric the trainer writes (trainer.metrics, trainer.cost):\n" + "\n".join(unknown)


@pytest.mark.parametrize(("name", "written"), [
    ("reward/mean", True), ("cost/step/seconds", True), ("policy/token_lag/hist/3", True),
    ("timing_s/update", True), ("timing_s/train", False), ("reward/mean/extra", False), ("batch/dropped/", False),
    ("reward/success_fraction", False), ("score/{env}", False),
])
def test_what_counts_as_a_written_name(name: str, written: bool) -> None:
    assert metrics.is_metric_name(name) is written


def test_the_run_page_keeps_no_copy_of_the_stages() -> None:
    """run.js and run.html take the stages from /v1/metric-names (embedded with the run): no list of
    them is written there (tests/api/test_metric_names.py holds what the page is given)."""
    for path in [ROOT / "api" / "dashboard" / "static" / "run.js", ROOT / "api" / "dashboard" / "templates" / "run.html"]:
        text = path.read_text()
        for stages in (cost.STAGES, metrics.STAGES):
            for first, second in itertools.pairwise(stages):
                assert not re.search(rf"\b{first}\b[^\n]{{0,40}}\b{second}\b", text), f"{path.name} lists {stages}"
    assert "NAMES.cost_stages" in (ROOT / "api" / "dashboard" / "static" / "run.js").read_text()


def _crash_points_passed() -> list[tuple[str, str]]:
    passed = []
    for path in sorted((ROOT / "trainer").rglob("*.py")) + sorted((ROOT / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "crash_point":
                first = node.args[0] if node.args else None
                name = first.value if isinstance(first, ast.Constant) else ast.unparse(first) if first else ""
                passed.append((f"{path.relative_to(ROOT)}:{node.lineno}", name))
    return passed


def test_every_crash_point_is_passed_in_a_step_and_no_other_is_named() -> None:
    passed = _crash_points_passed()
    assert {name for _, name in passed} == set(faults.POINTS), passed
    with pytest.raises(ValueError, match="expected one of update, pending, commit, promote, got 'pendng'"):
        faults.crash_point("pendng", step=1)


def test_an_unknown_timing_stage_is_refused_by_name() -> None:
    assert [metrics.timing_key(stage) for stage in metrics.STAGES] == [f"timing_s/{s}" for s in metrics.STAGES]
    with pytest.raises(ValueError, match="expected one of generate, score"):
        metrics.timing_key("train")


SHIPPED = ("api", "cli", "controller", "core", "environments", "sandboxes", "task_workers", "trainer", "recipes")
VOCABULARY = {
    "a run purpose compared as a string (core.termination.RunPurpose)": re.compile(r"purpose\s*[!=]=\s*[\"']"),
    "a difficulty bucket spelled out (core.termination.Bucket)": re.compile(r"[\"'](?:easy|medium|hard)[\"']"),
}


def test_run_purposes_and_buckets_are_named_by_their_enums() -> None:
    """RunPurpose and Bucket live beside RunStatus in core/termination.py; the database's CHECK, the
    launch schema, the API's filters and the controller read them from there, not from a copy."""
    found = []
    for folder in SHIPPED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "core" / "termination.py":
                continue
            text = path.read_text()
            found += [f"{path.relative_to(ROOT)}: {what}: {match.group(0)}"
                      for what, pattern in VOCABULARY.items() for match in pattern.finditer(text)]
    assert found == []


def test_episode_flags_are_named_by_their_enum() -> None:
    """The hack monitors' flags live in core/flags.py (EpisodeFlag); no shipped module or dashboard page
    spells one out. (`protected_paths` is left out of the scan: it is also the task payload's field.)"""
    from core.flags import EpisodeFlag

    spelled = re.compile("[\"'](?:" + "|".join(f for f in EpisodeFlag if f != EpisodeFlag.PROTECTED_PATHS) + ")[\"']")
    found = []
    for folder in SHIPPED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".py", ".js", ".html"} and path != ROOT / "core" / "flags.py":
                found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in spelled.finditer(path.read_text())]
    assert found == []
    assert spelled.search('flags == ["forged_exit"]')  # the scan sees a spelling

