"""Values observed inside a test run, carried out of it as data, and compared outside it.

    OBSERVER                      # source run inside the graded interpreter (part of grader.ENTRY_POINT)
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

OBSERVER = r'''
import base64 as _b64
import json as _json

_MAX_DEPTH, _MAX_ITEMS = 24, 20000
_EXACT = {type(None): "none", bool: "bool", int: "int", float: "float", complex: "complex", str: "str",
          bytes: "bytes", list: "list", tuple: "tuple", set: "set", frozenset: "frozenset", dict: "dict"}
_BASES = ((bool, "bool"), (int, "int"), (float, "float"), (complex, "complex"), (str, "str"), (bytes, "bytes"),
          (tuple, "tuple"), (list, "list"), (frozenset, "frozenset"), (set, "set"), (dict, "dict"))
_type, _isinstance, _id, _len, _sorted, _getattr = type, isinstance, id, len, sorted, object.__getattribute__


class _Budget:
    def __init__(self):
        self.left = _MAX_ITEMS

    def spend(self):
        self.left -= 1
        if self.left < 0:
            raise OverflowError("too many items")


def _builtin(value, kind, depth, path, budget):
    """The builtin value `value` carries, read through the builtin's own slots, never its class's."""
    if kind == "none":
        return ["none"]
    if kind == "bool":
        return ["bool", bool(int.__int__(value))]
    if kind == "int":
        return ["int", int.__format__(value, "#x")]
    if kind == "float":
        return ["float", float.__repr__(value)]
    if kind == "complex":
        return ["complex", float.__repr__(complex.real.__get__(value)), float.__repr__(complex.imag.__get__(value))]
    if kind == "str":
        return ["str", str.__str__(value)]
    if kind == "bytes":
        return ["bytes", _b64.b64encode(bytes(memoryview(value))).decode()]
    if kind in ("list", "tuple"):
        items = list.__iter__(value) if kind == "list" else tuple.__iter__(value)
        return [kind, [_encode(item, depth + 1, path, budget) for item in items]]
    if kind in ("set", "frozenset"):
        items = [_encode(item, depth + 1, path, budget) for item in (set.__iter__(value) if kind == "set"
                                                                      else frozenset.__iter__(value))]
        return [kind, _sorted(items, key=_json.dumps)]
    pairs = [[_encode(k, depth + 1, path, budget), _encode(v, depth + 1, path, budget)] for k, v in dict.items(value)]
    return ["dict", _sorted(pairs, key=_json.dumps)]


def _encode(value, depth=0, path=(), budget=None):
    budget = budget or _Budget()
    budget.spend()
    if depth > _MAX_DEPTH:
        return ["deep"]
    if _id(value) in path:
        return ["cycle"]
    path = path + (_id(value),)
    kind = _type(value)
    exact = _EXACT.get(kind)
    if exact is not None:
        return _builtin(value, exact, depth, path, budget)
    base = next((["base", _builtin(value, name, depth, path, budget)] for cls, name in _BASES
                 if _isinstance(value, cls)), ["base", ["none"]])
    try:
        attributes = dict.copy(_getattr(value, "__dict__"))
    except Exception:
        attributes = {}
    if not _isinstance(attributes, dict):
        attributes = {}
    for cls in kind.__mro__:
        for slot in cls.__dict__.get("__slots__", ()) if _isinstance(cls.__dict__.get("__slots__", ()), tuple) else ():
            try:
                attributes[slot] = _getattr(value, slot)
            except Exception:
                pass
    name = f"{_getattr(kind, '__module__')}.{_getattr(kind, '__qualname__')}"
    return ["object", str(name), base, _encode(attributes, depth + 1, path, budget)]


def _observe(values):
    try:
        return [_encode(value) for value in values]
    except Exception as error:  # an encoding that cannot finish is carried as such: it equals nothing
        return [["unencodable", _type(error).__name__]]
'''

MAX_OBSERVATIONS = 10_000
"""Per test: a run that observes more than this many asserts is cut off (and its test fails)."""


@dataclass(frozen=True)
class Opaque:
    """A value that is not a builtin, as it was observed: its type, the builtin it carries, its state."""

    type_name: str
    base: Any
    state: Any


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
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError):
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
        base = _decode(_exact(encoded[2], list)[1]) if encoded[2][0] == "base" else None
        return Opaque(_exact(encoded[1], str), _hashable(base), _hashable(_decode(encoded[3])))
    raise ValueError(f"expected an encoded value, got kind {kind!r}")  # "deep", "cycle", "unencodable", ...


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
