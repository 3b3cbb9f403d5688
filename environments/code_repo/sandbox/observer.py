"""Crucible's observer: runs inside the graded (or reference) test process, in a namespace of its own.

The grader's entry point (grader.ENTRY_POINT) executes this file into a fresh dict and puts its `check`,
`raises` and `raises_call` into builtins under the names the rewritten tests call
(`__crucible_check__`, ...); in a reference run also `leaf`, `mark` and `origin`. Nothing here holds the
grader's report, the outcomes or any expected value: what a check reports is only what the process
computed, encoded by value, and the worker judges it (blinding.py). Encoding never calls an object's own
methods (`__eq__`, `__repr__`, `__iter__`), so a value that lies about itself is carried as what it is.

Read by the worker as a package resource (observations.OBSERVER); never imported there.
"""

import base64 as _b64
import contextlib
import fnmatch as _fnmatch
import json as _json
import os as _os
import re as _re
import sys as _sys

_MAX_DEPTH, _MAX_ITEMS, _MAX_TEXT = 24, 200000, 10000
MAX_OBSERVATIONS = 10000
_EXACT = {type(None): "none", bool: "bool", int: "int", float: "float", complex: "complex", str: "str",
          bytes: "bytes", list: "list", tuple: "tuple", set: "set", frozenset: "frozenset", dict: "dict"}
_BASES = ((bool, "bool"), (int, "int"), (float, "float"), (complex, "complex"), (str, "str"), (bytes, "bytes"),
          (tuple, "tuple"), (list, "list"), (frozenset, "frozenset"), (set, "set"), (dict, "dict"))
_type, _isinstance, _id, _len, _sorted, _getattr = type, isinstance, id, len, sorted, object.__getattribute__
WORKSPACE = _os.environ.get("CRUCIBLE_OBSERVED_WORKSPACE", "/workspace").rstrip("/") + "/"
"""The repository under test (the variable: a scratch workspace for the benchmark and unit tests; the
grader's runs start with an empty environment)."""
TEST_GLOBS = ("test_*.py", "*_test.py", "tests/*", "test/*", "*/tests/*", "*/test/*", "conftest.py")
"""The repository's tests and their fixtures (task.TEST_FILES): their code is the test's, not the repository's."""

observations: dict = {}
"""Test id → [[site, encoded operands], ...], in the order the checks ran."""
state = {"test": "<collection>"}
ledger: dict = {"seen": set(), "repo": set(), "origins": {}}
"""Reference runs only: the leaves evaluated, those during which code of the repository ran, and where each
import's module lives (True: in the repository)."""


class _Budget:
    def __init__(self):
        self.left = _MAX_ITEMS

    def spend(self):
        self.left -= 1
        if self.left < 0:
            raise OverflowError("too many items")


def _name(cls):
    return f"{_getattr(cls, '__module__')}.{_getattr(cls, '__qualname__')}"


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
    path = (*path, _id(value))
    kind = _type(value)
    exact = _EXACT.get(kind)
    if exact is not None:
        return _builtin(value, exact, depth, path, budget)
    if _isinstance(value, type):
        return ["class", _name(value)]
    if kind is _re.Pattern:
        return ["pattern", _builtin(value.pattern, "str" if _isinstance(value.pattern, str) else "bytes", depth, path,
                                    budget), int(value.flags)]
    builtin = next((cls for cls, _ in _BASES if _isinstance(value, cls)), None)
    if builtin is not None and not _compares_itself(kind, builtin):  # a namedtuple, an IntEnum: its base value
        return _builtin(value, _EXACT[builtin], depth, path, budget)
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
            with contextlib.suppress(Exception):
                attributes[slot] = _getattr(value, slot)
    return ["object", str(_name(kind)), base, _encode(attributes, depth + 1, path, budget)]


_COMPARISONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__")


def _compares_itself(kind, builtin):
    """Whether a subclass of a builtin defines a comparison of its own above the builtin (then it is carried
    as an object: its own `__eq__` may say anything); without one it compares exactly as its base value."""
    for cls in kind.__mro__:
        if cls is builtin:
            return False
        if any(name in cls.__dict__ for name in _COMPARISONS):
            return True
    return True


def _observe(values):
    try:
        return [_encode(value) for value in values]
    except Exception as error:  # an encoding that cannot finish is carried as such: it equals nothing
        return [["unencodable", _type(error).__name__]]


def _record(site, encoded):
    seen = observations.setdefault(state["test"], [])
    if _len(seen) <= MAX_OBSERVATIONS:
        seen.append([str(site), encoded])


def check(site, values):
    """A check's operands (expected ones already gone from the graded source), for the worker to judge."""
    _record(site, _observe(values))


def _text(value):
    try:
        return str(value)[:_MAX_TEXT]
    except Exception:
        return None


def _lineage(cls):
    try:
        return [_name(c) for c in _getattr(cls, "__mro__")]
    except Exception:
        return []


class _Context:
    """What `with self.assertRaises(E) as cm` binds: `cm.exception` once the block ended."""

    exception = None


class _Raises:
    """pytest.raises / pytest.warns / assertRaises* / assertWarns*: reports what the block raised (or warned)
    beside the check's operands. Graded: catches everything and asserts nothing. Reference: behaves as the
    original check did (re.search of the pattern on str() of the exception or warning)."""

    def __init__(self, site, values, kind, style, reference):
        self.site, self.values, self.kind, self.style, self.reference = site, list(values), kind, style, reference

    def __enter__(self):
        if self.kind == "warns":
            from _pytest.recwarn import WarningsRecorder

            self.recorder = WarningsRecorder(_ispytest=True)
            return self.recorder.__enter__()
        from _pytest._code import ExceptionInfo

        self.info = ExceptionInfo.for_later()
        self.context = _Context()
        return self.context if self.style == "unittest" else self.info

    def __exit__(self, kind, value, traceback):
        if self.kind == "warns":
            return self._warned(kind)
        caught = ["raised"] if kind is None else ["raised", _lineage(kind), _text(value)]
        _record(self.site, [*_observe(self.values), caught])
        if kind is not None:
            self.info.fill_unfilled((kind, value, traceback))
            self.context.exception = value
        if not self.reference:
            return True
        expected = self.values[0]
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {expected!r}")
        if not issubclass(kind, expected):
            return False
        if _len(self.values) > 1 and self.values[1] is not None and not _re.search(self.values[1], str(value)):
            raise AssertionError(f"Regex pattern did not match.\n Regex: {self.values[1]!r}\n Input: {str(value)!r}")
        return True

    def _warned(self, kind):
        self.recorder.__exit__(None, None, None)
        records = list(self.recorder)
        caught = ["warned", [[_lineage(w.category), _text(w.message)] for w in records[:100]]]
        _record(self.site, [*_observe(self.values), caught])
        if kind is not None or not self.reference:
            return False
        expected, pattern = self.values[0], self.values[1] if _len(self.values) > 1 else None
        if not any(issubclass(w.category, expected) and (pattern is None or _re.search(pattern, str(w.message)))
                   for w in records):
            raise AssertionError(f"DID NOT WARN. No warnings of type {expected!r} matching {pattern!r} were emitted")
        return False


def raises(site, values, kind, style):
    return _Raises(site, values, kind, style, state.get("reference", False))


def raises_call(site, values, style, function, *args, **kwargs):
    with _Raises(site, values, "raises", style, state.get("reference", False)) as info:
        function(*args, **kwargs)
    return info if style == "pytest" else None


# -- reference runs only -------------------------------------------------------------------------------------
_counter = [0]
_repo_code: dict = {}


def is_repository(filename):
    """A file of the repository under test: in the workspace, not a test or a fixture."""
    filename = str(filename or "")
    if not filename.startswith(WORKSPACE):
        return False
    relative = filename[len(WORKSPACE):]
    name = relative.rsplit("/", 1)[-1]
    return not any(_fnmatch.fnmatchcase(name if "/" not in glob else relative, glob) for glob in TEST_GLOBS)


def _profile(frame, event, arg):
    if event == "call":
        code = frame.f_code
        repo = _repo_code.get(code)
        if repo is None:
            repo = _repo_code[code] = is_repository(code.co_filename)
        if repo:
            _counter[0] += 1


def mark():
    return _counter[0]


def leaf(lid, start, value):
    """A leaf's value, and whether code of the repository ran while it was computed."""
    ledger["seen"].add(lid)
    if _counter[0] != start:
        ledger["repo"].add(lid)
    return value


def origin(oid, package, level, module):
    """Where the module an import bound lives (a relative import resolved against the test's package)."""
    import importlib.util

    try:
        name = importlib.util.resolve_name("." * level + module, package) if level else module
    except (ImportError, ValueError):
        name = module
    found = _sys.modules.get(name)
    ledger["origins"][oid] = is_repository(getattr(found, "__file__", None))


def start_reference():
    """Trace calls into the repository's code from here on (every thread)."""
    import threading

    state["reference"] = True
    _sys.setprofile(_profile)
    threading.setprofile(_profile)


def ledger_report():
    return {"seen": _sorted(ledger["seen"]), "repo": _sorted(ledger["repo"]), "origins": dict(ledger["origins"])}
