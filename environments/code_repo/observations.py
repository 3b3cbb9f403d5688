"""Values observed inside a test run, carried out of it as data, and compared outside it.

    OBSERVER                      # sandbox/observer.py, run inside the test process by grader.ENTRY_POINT
    value = decode(["int", "0x5"])            # 5, in the worker's process
    holds(("==",), [value, 5])                # True: the comparison an assert made, judged here

Inside the sandbox, `__crucible_check__(site, [operands])` encodes each operand *by value with its exact
type*: builtins (None, bool, int, float, complex, str, bytes, list, tuple, set, frozenset, dict) as
themselves, anything else — a subclass of int included — as its type's qualified name, the builtin
value it carries and its attributes. Encoding never calls the object's own methods (`__eq__`,
`__repr__`, `__iter__`), so a value that lies about itself is carried as what it is.

Outside, `decode` rebuilds builtins as builtins and everything else as an `Opaque` value that equals only
an Opaque of the same type and state: an always-equal object, an int subclass whose `__eq__` says True,
`unittest.mock.ANY` — none of them equals the 5 a test expects. A garbled encoding is `Undecodable`,
which equals nothing.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

OBSERVER = resources.files("environments.code_repo").joinpath("sandbox/observer.py").read_text(encoding="utf-8")
"""The in-sandbox side (sandbox/observer.py), as text: the grader's entry point runs it in a namespace of its own."""

MAX_OBSERVATIONS = 10_000
"""Per test: a run that observes more than this many asserts is cut off (and its test fails)."""


@dataclass(frozen=True)
class Opaque:
    """A value that is not a builtin, as it was observed: its type, the builtin it carries, its state."""

    type_name: str
    base: Any
    state: Any


@dataclass(frozen=True)
class ClassRef:
    """A class, as its qualified name (`builtins.ValueError`)."""

    name: str


@dataclass(frozen=True)
class Raised:
    """What a raises block saw: the exception's classes (most derived first) and str(), or None: nothing."""

    lineage: tuple[str, ...] | None
    message: str | None


@dataclass(frozen=True)
class Warned:
    """What a warns block recorded: each warning's category lineage and message."""

    records: tuple[tuple[tuple[str, ...], str | None], ...]


class Approx:
    """`pytest.approx(expected, rel=, abs=, nan_ok=)` as the reference built it, compared here with pytest's
    rule (tolerance max(rel × |expected|, abs), rel 1e-6 and abs 1e-12 by default, abs alone when only abs
    is given), for numbers, sequences and mappings of numbers."""

    def __init__(self, expected: Any, rel: Any, abs_: Any, nan_ok: Any) -> None:
        self.expected, self.rel, self.abs, self.nan_ok = expected, rel, abs_, bool(nan_ok)

    @classmethod
    def of(cls, state: Any) -> Approx:
        if not isinstance(state, dict) or "expected" not in state:
            raise ValueError("expected an approx object's attributes")
        return cls(state["expected"], state.get("rel"), state.get("abs"), state.get("nan_ok"))

    def _scalar(self, expected: Any, actual: Any) -> bool:
        if type(actual) is bool or type(expected) is bool:
            return type(actual) is type(expected) and actual == expected
        if not isinstance(actual, int | float | complex) or not isinstance(expected, int | float | complex):
            return bool(actual == expected) if type(actual) is type(expected) else False
        if actual == expected:
            return True
        if math.isnan(abs(expected)):
            return self.nan_ok and math.isnan(abs(actual))
        if math.isinf(abs(expected)):
            return False
        absolute = 1e-12 if self.abs is None else float(self.abs)
        if self.rel is None and self.abs is not None:
            tolerance = absolute
        else:
            tolerance = max((1e-6 if self.rel is None else float(self.rel)) * abs(expected), absolute)
        return bool(abs(expected - actual) <= tolerance)

    def _fields(self) -> tuple[Any, ...]:
        return (repr(self.expected), repr(self.rel), repr(self.abs), self.nan_ok)

    def __eq__(self, actual: object) -> bool:
        expected = self.expected
        if isinstance(actual, Approx):  # two reference runs' approx objects: the same settings
            return self._fields() == actual._fields()
        if isinstance(expected, dict):
            return isinstance(actual, dict) and set(actual) == set(expected) \
                and all(self._scalar(expected[k], actual[k]) for k in expected)
        if isinstance(expected, list | tuple):
            return isinstance(actual, list | tuple) and len(actual) == len(expected) \
                and all(self._scalar(e, a) for e, a in zip(expected, actual, strict=True))
        return self._scalar(expected, actual)

    def __ne__(self, actual: object) -> bool:
        return not self.__eq__(actual)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"approx({self.expected!r})"


class Undecodable:
    """An encoding that does not decode: equals nothing, not even itself."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted(((repr(k), _hashable(v)) for k, v in value.items()), key=lambda kv: kv[0]))
    if isinstance(value, set):
        return frozenset(value)
    return value


def decode(encoded: Any) -> Any:
    """Rebuild an observed value in this process (never evaluating anything the sandbox sent)."""
    try:
        return _decode(encoded)
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError, re.error):
        return Undecodable()


def _decode(encoded: Any) -> Any:
    kind = encoded[0]
    simple: dict[str, Callable[[], Any]] = {
        "none": lambda: None, "bool": lambda: _exact(encoded[1], bool), "int": lambda: int(_exact(encoded[1], str), 16),
        "float": lambda: float(_exact(encoded[1], str)), "str": lambda: _exact(encoded[1], str),
        "complex": lambda: complex(float(_exact(encoded[1], str)), float(_exact(encoded[2], str))),
        "bytes": lambda: _bytes(encoded[1]),
    }
    if kind in simple:
        return simple[kind]()
    if kind in ("list", "tuple", "set", "frozenset"):
        items = [_decode(item) for item in _exact(encoded[1], list)]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
    if kind == "dict":
        return {_decode(k): _decode(v) for k, v in _exact(encoded[1], list)}
    if kind == "object":
        name = _exact(encoded[1], str)
        if name.startswith("_pytest.") and name.rpartition(".")[2].startswith("Approx"):
            return Approx.of(_decode(encoded[3]))
        base = _decode(_exact(encoded[2], list)[1]) if encoded[2][0] == "base" else None
        return Opaque(name, _hashable(base), _hashable(_decode(encoded[3])))
    if kind == "pattern":  # a compiled pattern the reference computed (compiled here only to search)
        return re.compile(_decode(_exact(encoded[1], list)), _exact(encoded[2], int))
    if kind == "class":
        return ClassRef(_exact(encoded[1], str))
    if kind == "raised":
        if len(encoded) == 1:
            return Raised(None, None)
        return Raised(tuple(_exact(n, str) for n in _exact(encoded[1], list)), _text_or_none(encoded[2]))
    if kind == "warned":
        return Warned(tuple((tuple(_exact(n, str) for n in _exact(item[0], list)), _text_or_none(item[1]))
                            for item in _exact(encoded[1], list)))
    raise ValueError(f"expected an encoded value, got kind {kind!r}")  # "deep", "cycle", "unencodable", ...


def _text_or_none(value: Any) -> str | None:
    return None if value is None else _exact(value, str)


def _exact(value: Any, kind: type) -> Any:
    if type(value) is not kind:
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _bytes(text: Any) -> bytes:
    import base64

    return base64.b64decode(_exact(text, str), validate=True)


OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "in": lambda a, b: operator.contains(b, a), "not in": lambda a, b: not operator.contains(b, a),
    "is": operator.is_, "is not": operator.is_not,
}


def holds(ops: Sequence[str], values: Sequence[Any]) -> bool:
    """`values[0] ops[0] values[1] ops[1] values[2] ...` as Python chains it, judged on decoded values.
    Anything odd (an Undecodable, an Opaque that cannot be ordered, NaN) is False, never an error."""
    if len(values) != len(ops) + 1 or any(isinstance(value, Undecodable) for value in values):
        return False
    try:
        return all(bool(OPERATORS[op](values[i], values[i + 1])) for i, op in enumerate(ops))
    except Exception:
        return False


def same(a: Any, b: Any) -> bool:
    """Two observations of one operand carry the same value (NaN equals NaN here: it is the same value)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


MAX_MESSAGE = 10_000


def _search(pattern: Any, text: str | bytes | None) -> bool:
    """re.search as pytest's `match` and unittest's *Regex do it; the pattern is the reference's own value."""
    if pattern is None:
        return True
    if not isinstance(text, str | bytes) or not isinstance(pattern, str | bytes | re.Pattern):
        return False
    try:
        return re.search(pattern, text[:MAX_MESSAGE]) is not None  # type: ignore[arg-type]
    except (re.error, TypeError):
        return False


def _names(expected: Any) -> set[str] | None:
    items = expected if isinstance(expected, tuple) else (expected,)
    if not items or not all(isinstance(item, ClassRef) for item in items):
        return None
    return {item.name for item in items}


def raised_as_expected(expected: Any, pattern: Any, caught: Any) -> bool:
    """The block raised an instance of `expected` (a class or a tuple of them) whose str() `pattern` finds."""
    names = _names(expected)
    return (names is not None and isinstance(caught, Raised) and caught.lineage is not None
            and bool(names & set(caught.lineage)) and _search(pattern, caught.message))


def warned_as_expected(expected: Any, pattern: Any, caught: Any) -> bool:
    names = _names(expected)
    return names is not None and isinstance(caught, Warned) and any(
        names & set(lineage) and _search(pattern, message) for lineage, message in caught.records)


def _number(value: Any) -> bool:
    return (isinstance(value, int | float | complex) and type(value) is not bool) or type(value) is bool


def close(a: Any, b: Any, options: dict[str, Any]) -> bool:
    """math.isclose, for observed numbers only (anything else is False)."""
    if not (_number(a) and _number(b)) or not all(_number(v) for v in options.values()):
        return False
    try:
        return math.isclose(a, b, **options)
    except (TypeError, ValueError):
        return False


def almost_equal(a: Any, b: Any, options: dict[str, Any]) -> bool:
    """unittest's assertAlmostEqual: equal, or |a - b| <= delta, or round(|a - b|, places (7)) == 0."""
    try:
        if type(a) is type(b) and a == b and not isinstance(a, Opaque | Undecodable):
            return True
        if not (_number(a) and _number(b)):
            return False
        difference = abs(a - b)
        if options.get("delta") is not None:
            return bool(difference <= options["delta"])
        places = options.get("places")
        return round(difference, 7 if places is None else int(places)) == 0
    except (TypeError, ValueError, OverflowError):
        return False


def regex_found(text: Any, pattern: Any) -> bool:
    return isinstance(text, str | bytes) and _search(pattern, text)


def same_items(a: Any, b: Any) -> bool:
    """unittest's assertCountEqual: the same elements, the same number of times each."""
    containers = list | tuple | set | frozenset | str | bytes | dict
    if not isinstance(a, containers) or not isinstance(b, containers):
        return False
    left, right = list(a), list(b)
    if len(left) != len(right):
        return False
    for item in left:
        for index, other in enumerate(right):
            if same(item, other) or (type(item) is type(other) and _equal(item, other)):
                del right[index]
                break
        else:
            return False
    return not right


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False
