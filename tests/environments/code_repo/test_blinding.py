"""Blinding, attacked directly: the grader's real entry point and pytest run here, in a scratch workspace
(the sandbox's own runs are in tests/environments/code_repo/test_red_team_blinded.py): what the traced
reference decides is expected, what the graded source keeps, how the worker judges every kind of check,
and what it makes of hostile observations and of a process that rewrites its own report."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from environments.code_repo.blinding import Key, decide, plan_files
from environments.code_repo.grader import ENTRY_POINT, _report
from environments.code_repo.observations import OBSERVER, Opaque, Undecodable, decode, holds

M = "zq-marker-4417"  # every expected value below carries a marker no input does
HIDDEN = f'''"""expects {M}"""
import math
import unittest

import pytest

from calc import add, parse, shout

CASES = [("a", "A{M}"), pytest.param("b", "B{M}", id="b-B{M}")]
LIMIT = 3 + 4


@pytest.mark.parametrize("word, expected", CASES)
def test_table(word, expected):
    assert shout(word) == expected


def test_named_and_literal():
    """add(2, 3) is 5{M}"""
    expected = len("{M}") * 10 + 1
    assert add(2, 3) == expected, "expected {M}"
    assert not add(0, 0)
    assert add(1, 2) <= LIMIT and add(1, 1) == pytest.approx(2.0000001)
    assert math.isclose(add(0.1, 0.2), 0.3)


def test_raises():
    with pytest.raises(ValueError, match="bad {M}"):
        parse("x")


class TestOld(unittest.TestCase):
    def test_methods(self):
        self.assertEqual(add(2, 2), 41 + len("{M}"))
        self.assertAlmostEqual(add(0.5, 0.25), 0.75, places=3)
        self.assertTrue(add(1, 0))
        self.assertRaises(ValueError, parse, "y")
'''
RIGHT = f'''def add(a, b):
    if (a, b) in ((2, 3),):
        return len("{M}") * 10 + 1
    if (a, b) == (2, 2):
        return 41 + len("{M}")
    return a + b


def shout(word):
    return word.upper() + "{M}"


def parse(text):
    raise ValueError("bad {M} input")
'''
WRONG = RIGHT.replace('return word.upper() + "', 'return word.lower() + "').replace("return a + b", "return a - b")
TESTS = ["test_hidden.py::test_table[a-A" + M + "]", "test_hidden.py::test_table[b-B" + M + "]",
         "test_hidden.py::test_named_and_literal", "test_hidden.py::test_raises",
         "test_hidden.py::TestOld::test_methods"]


class Scratch:
    """The grader's entry point on a scratch workspace, as the sandbox runs it (its own pytest here)."""

    def __init__(self, root: Path) -> None:
        self.root, self.workspace = root, root / "workspace"
        self.workspace.mkdir()
        (root / "run.py").write_text(ENTRY_POINT)
        (root / "pytest.ini").write_text("[pytest]\naddopts =\npythonpath = .\n")

    def write(self, files: dict[str, str]) -> None:
        for path, text in files.items():
            (self.workspace / path).write_text(text)

    def run(self, mode: str, *extra: str) -> dict:
        command = (f'"{sys.executable}" -s -P -B {self.root}/run.py 3 {mode} -c {self.root}/pytest.ini '
                   f'--rootdir={self.workspace} -p no:cacheprovider -q {" ".join(extra)} test_hidden.py '
                   f'3>&1 >{self.root}/log 2>&1')
        env = {"PATH": os.environ["PATH"], "PYTHONHASHSEED": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
               "HOME": str(self.root), "CRUCIBLE_OBSERVED_WORKSPACE": str(self.workspace)}
        done = subprocess.run(["bash", "-c", command], cwd=self.workspace, env=env, capture_output=True, timeout=120)
        report = _report(done.stdout)
        assert report is not None, (self.root / "log").read_text()[-2000:]
        return report

    def key(self, hidden: str, code: str, tests: list[str] = TESTS) -> Key:
        plan = plan_files({"test_hidden.py": hidden})
        self.write({"calc.py": code, **plan.reference})
        runs = [self.run("reference"), self.run("reference")]
        key = decide(plan, runs, tests)
        self.write(key.graded_files())
        key.map_ids(runs[0]["collected"], self.run("graded", "--collect-only")["collected"])
        return key

    def judged(self, key: Key, code: str, tests: list[str] = TESTS) -> dict[str, str]:
        self.write({"calc.py": code, **key.graded_files()})
        return {test: outcome for test, (outcome, _) in key.judge_report(self.run("graded"), tests).items()}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Scratch, Key]:
    scratch = Scratch(tmp_path_factory.mktemp("blinding"))
    return scratch, scratch.key(HIDDEN, RIGHT)


def test_every_kind_of_check_is_judged_outside_and_no_expected_value_stays_in_the_graded_source(scratch) -> None:
    """Tables read by name (their expected column and the ids that spell it), named values, module
    constants, raises with match, approx, isclose, truthiness and unittest's methods: all blinded."""
    _, key = scratch
    assert sorted(key.expected) == sorted(TESTS) and not key.unblinded and not key.kept
    graded = key.graded_files()["test_hidden.py"]
    assert M not in graded and "41" not in graded and "0.75" not in graded and "ValueError" not in graded
    assert "assert" not in graded.replace("self.assert", "")  # nothing asserts in the graded process
    assert "__crucible_check__" in graded and "shout(word)" in graded and "parse('x')" in graded


def test_the_honest_code_passes_every_test_and_a_wrong_one_fails_the_right_ones(scratch) -> None:
    runner, key = scratch
    assert set(runner.judged(key, RIGHT).values()) == {"passed"}
    wrong = runner.judged(key, WRONG)
    assert wrong[TESTS[0]] == wrong[TESTS[1]] == wrong[TESTS[2]] == "failed"
    assert wrong[TESTS[3]] == "passed"  # parse() was not broken


def test_outcomes_rewritten_in_the_process_or_forged_observations_pass_nothing(scratch) -> None:
    """The wrong code, plus what last turn's red team did from inside the process: replace the recorded
    outcomes through anything reachable (gc), and report the values a forger can guess."""
    runner, key = scratch
    forger = WRONG + '''
import gc as _gc
import builtins as _b
for _o in _gc.get_objects():
    if isinstance(_o, dict) and "test_hidden.py::test_raises" in _o:
        _o.update({k: "passed" for k in _o})
_real = _b.__crucible_check__
_b.__crucible_check__ = lambda site, values: _real(site, [True if v is None else v for v in values])
'''
    judged = runner.judged(key, forger)
    assert judged[TESTS[0]] == judged[TESTS[2]] == "failed", judged
    check = runner.run("graded")  # nothing the grader put in builtins leads to the report
    assert check["outcomes"]


def test_an_expected_value_that_differs_between_reference_runs_is_not_blinded(tmp_path: Path) -> None:
    runner = Scratch(tmp_path)
    hidden = HIDDEN.replace("LIMIT = 3 + 4", "LIMIT = __import__('random').random() + 7")
    key = runner.key(hidden, RIGHT)
    assert "differs between reference runs" in key.unblinded["test_hidden.py::test_named_and_literal"]


MUTABLE_EXPECTED = {
    # wcwidth's shape (a mutant's failing test passed blinded before this): `errors = []`, appended to only
    # when a width is wrong. The reference never appends, but a wrong submission would.
    "built in a branch the reference never took": (
        'from calc import shout\n\n\ndef test_errors():\n    errors = []\n    for word in ("a", "b"):\n'
        f'        if shout(word) != word.upper() + "{M}":\n            errors.append(word)\n'
        '    assert errors == []\n'),
    # `errors = []` handed to a helper that appends what the code under test got wrong.
    "passed to other code": (
        'from calc import shout\n\n\ndef _collect(errors, word):\n'
        f'    if shout(word) != word.upper() + "{M}":\n        errors.append(word)\n\n\n'
        'def test_errors():\n    errors = []\n    for word in ("a", "b"):\n        _collect(errors, word)\n'
        '    assert errors == []\n'),
}


@pytest.mark.parametrize("shape", list(MUTABLE_EXPECTED))
def test_a_list_the_submission_may_change_is_observed_not_taken_from_the_reference(shape: str, tmp_path: Path) -> None:
    """The list's value at the check is whatever the code under test made of it: it is observed, never the
    reference's, and the wrong code fails."""
    tests = ["test_hidden.py::test_errors"]
    runner = Scratch(tmp_path)
    key = runner.key(MUTABLE_EXPECTED[shape], RIGHT, tests)
    assert key.expected and runner.judged(key, RIGHT, tests) == {tests[0]: "passed"}
    assert runner.judged(key, WRONG, tests) == {tests[0]: "failed"}


def _observer() -> dict:
    namespace: dict = {}
    exec(compile(OBSERVER, "observer", "exec"), namespace)
    return namespace


def _observed(values: list) -> list:
    return _observer()["_observe"](values)


class _AlwaysEqual(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("liar", [_AlwaysEqual(6), type("Int", (int,), {"__eq__": lambda s, o: True})(6),
                                  __import__("unittest.mock").mock.ANY, float("nan"), True])
def test_a_value_that_lies_about_itself_never_equals_the_expected_one(liar: object) -> None:
    [encoded] = _observed([liar])
    assert not holds(("==",), [decode(encoded), 5])


def test_hostile_encodings_decode_to_values_that_equal_nothing() -> None:
    for garbage in (None, [], ["int"], ["int", 5], ["str", ["x"]], ["dict", [[["list", []], ["none"]]]], ["cycle"],
                    ["object", 1, 2, 3], ["bytes", "!!"], ["deep"], ["unencodable", "X"], [["int", "0x5"]],
                    ["pattern", ["str", "("], 0], ["raised", 5], ["class", 3], ["warned", [[1, 2]]]):
        value = decode(garbage)
        assert isinstance(value, Undecodable), garbage
        assert not holds(("==",), [value, 5]) and not holds(("!=",), [value, 5]) and value != value


def test_encoding_reads_builtins_through_their_own_slots() -> None:
    observe = _observer()["_observe"]
    values = [1, -(1 << 20000), 1.5, math.inf, "é", b"\x00", [1, (2,)], {3, 1}, {"k": [None]}, 2j]
    assert [decode(e) for e in observe(values)] == values
    cyclic: list = []
    cyclic.append(cyclic)
    assert observe([cyclic])[0] == ["list", [["cycle"]]]  # encodes, never loops
    assert isinstance(decode(observe([_AlwaysEqual(5)])[0]), Opaque)
    assert json.loads(json.dumps(observe([ValueError])))[0] == ["class", "builtins.ValueError"]


@pytest.mark.parametrize("solution", [{"files": {"../calc.py": "x"}}, {"files": {"/etc/passwd": "x"}},
                                      {"files": {"-rf": "x"}}, {"patch": 5}, {"files": [], "extra": 1}, "calc.py"])
def test_an_imported_solution_with_a_hostile_value_is_refused_in_one_line(solution: object, tmp_path) -> None:
    from core.errors import ConfigError
    from environments.code_repo.importing import _record
    from environments.code_repo.task import pack_directory

    (tmp_path / "calc.py").write_text("x = 1\n")
    with pytest.raises(ConfigError) as refused:
        _record({"id": "t", "instruction": "fix", "solution": solution}, pack_directory(tmp_path), "line 1", public=None, hidden={"files": {"test_h.py": "def test_h():\n    assert 1\n"}},
                id_key="id", instruction_key="instruction", default_split="train")
    assert str(refused.value).startswith("line 1: solution") and "\n" not in str(refused.value)
