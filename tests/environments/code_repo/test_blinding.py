"""Blinding, attacked directly: what the graded source keeps, how observed values are encoded inside the
sandbox (the real OBSERVER source, run here) and judged outside, and what the comparator makes of hostile
observations. End to end through real sandboxes: tests/task_workers/episode/test_red_team_blinded.py."""

from __future__ import annotations

import math

import pytest

from environments.code_repo.blinding import Key, decide, plan_files
from environments.code_repo.observations import OBSERVER, Opaque, Undecodable, decode, holds

HIDDEN = '''"""add(2, 3) is 5"""
from calc import add


def test_add():
    """expects 5"""
    assert add(2, 3) == 5, "expected 5"
    assert 0 < add(1, 2) <= 3


def test_truth():
    assert add(1, 1)
'''


def _observer() -> dict:
    namespace: dict = {}
    exec(compile(OBSERVER, "observer", "exec"), namespace)
    return namespace


def test_the_graded_source_holds_no_expected_operand_docstring_or_message() -> None:
    plan = plan_files({"test_hidden.py": HIDDEN})
    key = Key(plan=plan, expected={}, blind=frozenset(plan.sites), unblinded={})
    graded = key.graded_files()["test_hidden.py"]
    assert "5" not in graded and "expected" not in graded and '"""' not in graded
    assert "__crucible_check__" in graded and "add(2, 3)" in graded
    assert "assert add(1, 1)" in graded  # no expected operand: stays a plain assert


def _observed(values: list) -> list:
    return _observer()["_observe"](values)


def _key(values_per_run: list[list]) -> Key:
    plan = plan_files({"test_hidden.py": HIDDEN})
    sites = sorted(plan.sites)
    runs = [{"outcomes": {"test_hidden.py::test_add": "passed", "test_hidden.py::test_truth": "passed"},
             "observations": {"test_hidden.py::test_add": [[sites[0], _observed(first)], [sites[1], _observed(second)]]}}
            for first, second in values_per_run]
    return decide(plan, runs, ["test_hidden.py::test_add", "test_hidden.py::test_truth"])


def test_a_blinded_test_passes_only_on_the_values_the_reference_expects() -> None:
    key = _key([([5, 5], [0, 3, 3])] * 2)
    assert "test_hidden.py::test_add" in key.expected
    assert key.unblinded == {"test_hidden.py::test_truth": "no assert with an expected value was reached"}
    sites = sorted(key.plan.sites)
    right = [(sites[0], _observed([5, None])), (sites[1], _observed([None, 3, None]))]
    wrong = [(sites[0], _observed([6, None])), (sites[1], _observed([None, 3, None]))]
    assert key.judge("test_hidden.py::test_add", "passed", right) == ("passed", "")
    assert key.judge("test_hidden.py::test_add", "passed", wrong)[0] == "failed"
    assert key.judge("test_hidden.py::test_add", "failed", right)[0] == "failed"  # the process must agree
    assert key.judge("test_hidden.py::test_add", "passed", right[:1])[0] == "failed"  # an assert left out
    assert key.judge("test_hidden.py::test_add", "passed", right[::-1])[0] == "failed"  # out of order


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
                    ["object", 1, 2, 3], ["bytes", "!!"], ["deep"], ["unencodable", "X"], [["int", "0x5"]]):
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


def test_an_expected_value_that_differs_between_reference_runs_is_not_blinded() -> None:
    key = _key([([5, 5], [0, 3, 3]), ([5, 6], [0, 3, 3])])
    assert "test_hidden.py::test_add" not in key.expected
    assert "differs between reference runs" in key.unblinded["test_hidden.py::test_add"]
    assert not key.blind


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
