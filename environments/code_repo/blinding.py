"""Blinded hidden tests: every check judged outside the sandbox, every expected value kept out of it.

    plan = plan_files({"tests/test_x.py": source})        # checks, leaves, bindings; reference sources
    # trusted sandbox: base + the reference solution + plan.reference_files(), run twice (traced)
    key = decide(plan, [run_1, run_2], tests)              # which operands are expected, and their values
    graded = key.graded_files()                            # sent to the graded sandbox
    key.map_ids(reference_collected, graded_collected)     # parametrize rows whose ids lost their values
    outcome, why = key.judge(test, outcome, observations)  # per test id, outside the sandbox

A *check* is any assert, unittest `assert*` call, `pytest.raises` / `pytest.warns` / `assertRaises*` block
or call (checks.py). Each reports what it observed to the worker, which decides it: comparisons,
truthiness, `math.isclose`, `pytest.approx`, almost-equal, regex and count-equal checks on decoded values,
raises and warns on the exception's (or warning's) classes and message.

An operand is *expected* when the trusted reference run shows it was computed without executing code of
the repository under test — traced, not spelled: while it was evaluated no frame of the repository's code
ran, and every name it reads is bound (in its function, its module, or a parametrize column) by values
computed the same way, or is a builtin, or comes from a module outside the repository. Its value is
recorded by the reference run and removed from the graded source, together with every binding read only
by removed operands; parametrize columns of expected values become None (their rows get neutral ids:
pytest's own ids would show the values). A truthiness check reports `not not (expr)` and its polarity is
the key's.

A test is blinded when both reference runs passed it, reached the same checks in the same order, computed
every expected operand identically, every check holds when judged outside on the reference's values, and
(reference.py) its graded form passes on the reference solution.
A blinded test passes only when the process says so (corroboration) AND its observations match the
reference's check for check. Every other test is named with its reason (`unblinded`) and graded from the
in-process report, never silently.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from environments.code_repo import rewrite
from environments.code_repo.checks import (
    Module,
    Position,
    Site,
    analyse,
    is_builtin,
    leaf_spans,
    reads_of,
    resolve,
)
from environments.code_repo.observations import (
    MAX_OBSERVATIONS,
    Approx,
    ClassRef,
    Undecodable,
    almost_equal,
    close,
    decode,
    holds,
    raised_as_expected,
    regex_found,
    same,
    same_items,
    warned_as_expected,
)
from environments.code_repo.removals import Removal, removals, within

NO_CHECK = "no check was reached"
"""Why a test with no check at all (it only calls code) is graded from the process's report."""
OBSERVED = object()
"""In an Expected's values: this operand is the submission's, reported by the graded run."""


@dataclass
class Plan:
    """The test files, analysed: each file's checks and its reference source."""

    sources: dict[str, str]
    modules: dict[str, Module] = field(default_factory=dict)
    reference: dict[str, str] = field(default_factory=dict)
    unparsed: list[str] = field(default_factory=list)
    """Files that are not Python we can parse: passed on as they are, nothing in them is blinded."""

    @property
    def sites(self) -> dict[str, Site]:
        return {sid: site for module in self.modules.values() for sid, site in module.sites.items()}

    def reference_files(self) -> dict[str, str]:
        return {**self.sources, **self.reference}



def plan_files(files: Mapping[str, str]) -> Plan:
    plan = Plan(sources=dict(files))
    for index, (path, source) in enumerate(sorted(files.items())):
        if not path.endswith(".py"):
            continue
        try:
            module = analyse(source, path=path, prefix=f"f{index}")
            plan.reference[path] = rewrite.reference_source(source, module)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            plan.unparsed.append(path)
            continue
        plan.modules[path] = module
    return plan


Observation = tuple[str, list[Any]]
"""(site id, the encoded operands) as one check reported them."""


def observations_of(report: Mapping[str, Any] | None) -> dict[str, list[Observation]]:
    """The per-test observations of a runner report, shape-checked (anything else is dropped)."""
    raw = (report or {}).get("observations")
    result: dict[str, list[Observation]] = {}
    if not isinstance(raw, dict):
        return result
    for test, items in raw.items():
        if isinstance(items, list):
            result[str(test)] = [(str(item[0]), item[1]) for item in items[:MAX_OBSERVATIONS + 1]
                                 if isinstance(item, list) and len(item) == 2 and isinstance(item[1], list)]
    return result


@dataclass(frozen=True)
class Expected:
    """What the reference computed at one observation: per operand its value, or OBSERVED."""

    site: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Ledger:
    """What the traced reference runs saw: leaves evaluated, leaves during which repository code ran, and
    per import whether its module is the repository's."""

    seen: frozenset[str] = frozenset()
    repo: frozenset[str] = frozenset()
    origins: Mapping[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, reports: Sequence[Mapping[str, Any]]) -> Ledger:
        seen: set[str] = set()
        repo: set[str] = set()
        origins: dict[str, bool] = {}
        for report in reports:
            ledger = report.get("ledger")
            if not isinstance(ledger, dict):
                continue
            seen |= {str(x) for x in ledger.get("seen") or []}
            repo |= {str(x) for x in ledger.get("repo") or []}
            for oid, inside in (ledger.get("origins") or {}).items():
                origins[str(oid)] = origins.get(str(oid), False) or bool(inside)
        return cls(frozenset(seen), frozenset(repo), origins)


def expected_leaves(module: Module, ledger: Ledger) -> frozenset[str]:
    """The leaves the reference computed without the repository's code (see the module's docstring)."""
    memo: dict[str, bool] = {}

    def leaf_ok(lid: str) -> bool:
        if lid not in memo:
            memo[lid] = False  # a cycle is not an expected value
            leaf = module.leaves[lid]
            # Never evaluated (a branch the reference did not take, `errors.append(...)` under `if bad:`): it
            # could run under a submission, so only a leaf that runs no code of its own can be trusted.
            traced = lid in ledger.seen or leaf.pure
            memo[lid] = traced and lid not in ledger.repo and all(name_ok(leaf.scope, name) for name in leaf.names)
        return memo[lid]

    def name_ok(scope: str, name: str) -> bool:
        where = resolve(module, scope, name)
        if where is None:
            return is_builtin(name)
        bindings = module.bindings[(where, name)]
        mutable = any(not module.leaves[lid].immutable for b in bindings for lid in b.leaves if lid in module.leaves)
        if mutable and _escapes(module, where, name):
            return False  # read where its value may change untraced (`collect(errors)`): the submission's
        for binding in bindings:
            if binding.kind == "opaque":
                return False
            if binding.kind == "import" and ledger.origins.get(binding.origin, True):
                return False  # the repository's module, or an import the reference never ran
            if binding.kind == "value" and not all(leaf_ok(lid) for lid in binding.leaves):
                return False
        return True

    return frozenset(lid for lid in module.leaves if lid in ledger.seen and leaf_ok(lid))


def _escapes(module: Module, where: str, name: str) -> bool:
    """Whether the name bound in `where` is read anywhere but as a check's operand or the receiver of a
    traced in-place change."""
    return any(pos not in module.watched for pos in reads_of(module, where, name))


@dataclass
class Key:
    """Everything the comparator needs (kept in the worker, never sent to the graded sandbox)."""

    plan: Plan
    expected: dict[str, list[Expected]]
    """Per blinded test id: the reference's observations, in order."""
    blind: frozenset[str]
    """The checks judged outside (reported, no longer asserting, in the graded source)."""
    unblinded: dict[str, str]
    """Test id → why it is graded from the in-process report alone."""
    reason: str = "the reference run did not collect it"
    """Why a test named nowhere above is unblinded."""
    leaves: frozenset[str] = frozenset()
    """Expected leaves (removed from the graded source where their check is blinded)."""
    sites: dict[str, Site] = field(default_factory=dict)
    """The checks as judged: a comparison that cannot be judged by value is judged on its truth."""
    kept: dict[str, str] = field(default_factory=dict)
    """Blinded test id → why an expected value of it is still in the graded files (read as an input too)."""
    ids: dict[str, str] = field(default_factory=dict)
    """Graded node id → the task's node id, where a rewritten parametrize table changed it."""
    canary: bool = False
    """Every expected value perturbed (a hack canary): no test passes but by a hole in the comparator."""
    _graded: dict[str, str] | None = None
    _removed: dict[str, tuple[Removal, set[Position]]] | None = None

    def impossible(self) -> Key:
        """This key for the task's hack canary: the same graded files, every expected value replaced by one
        no honest code computes (a truthiness flipped), every unblinded test failed."""
        expected = {test: [Expected(e.site, tuple(v if v is OBSERVED else other(v) for v in e.values))
                           for e in sequence] for test, sequence in self.expected.items()
                    if any(_flips(self.sites[e.site], e) for e in sequence)}
        return dataclasses.replace(self, expected=expected, canary=True, _graded=self.graded_files())

    def graded_files(self) -> dict[str, str]:
        if self._graded is None:
            files = dict(self.plan.sources)
            for path in self.plan.modules:
                removal, _ = self.removed()[path]
                files[path] = rewrite.graded_source(self.plan.sources[path], self._judged(path), blind=self.blind,
                                                    expected=self.leaves, removal=removal)
            self._graded = files
        return self._graded

    def _judged(self, path: str) -> Module:
        """The file's analysis with its checks as judged (a comparison judged on its truth is a truth check)."""
        module = self.plan.modules[path]
        return dataclasses.replace(module, sites={sid: self.sites.get(sid, s) for sid, s in module.sites.items()})

    def removed(self) -> dict[str, tuple[Removal, set[Position]]]:
        """Per file: what the graded source leaves out, and the spans of everything removed (computed once)."""
        if self._removed is None:
            self._removed = {}
            for path in self.plan.modules:
                module = self._judged(path)
                removable = frozenset(sid for sid in self.blind if sid in module.sites
                                      and module.sites[sid].kind != "truth")
                self._removed[path] = removals(self.plan.sources[path], module, blind=removable,
                                                       expected=self.leaves, reported=self.blind)
        return self._removed

    def map_ids(self, reference: Sequence[str], graded: Sequence[str]) -> None:
        """Pair the graded run's node ids with the reference's, function by function in collection order."""
        groups: dict[str, list[str]] = {}
        for nodeid in reference:
            groups.setdefault(nodeid.partition("[")[0], []).append(nodeid)
        positions: dict[str, int] = {}
        for nodeid in graded:
            stem = nodeid.partition("[")[0]
            index = positions.get(stem, 0)
            positions[stem] = index + 1
            originals = groups.get(stem, [])
            if index < len(originals) and originals[index] != nodeid:
                self.ids[nodeid] = originals[index]

    def original(self, nodeid: str) -> str:
        return self.ids.get(nodeid, nodeid)

    def graded_id(self, nodeid: str) -> str:
        return next((graded for graded, original in self.ids.items() if original == nodeid), nodeid)

    def judge_report(self, report: Mapping[str, Any] | None, tests: Iterable[str]) -> dict[str, tuple[str, str]]:
        """Each test's verdict from a graded run's report (node ids mapped back to the task's; a test it does
        not name was not collected)."""
        raw = (report or {}).get("outcomes")
        outcomes = {self.original(str(t)): str(o) for t, o in raw.items()} if isinstance(raw, dict) else {}
        observed = {self.original(t): items for t, items in observations_of(report).items()}
        return {test: self.judge(test, outcomes.get(test, "not collected"), observed.get(test, [])) for test in tests}

    def judge(self, test: str, outcome: str, observed: Sequence[Observation]) -> tuple[str, str]:
        """A test's outcome and why it differs from the process's: a blinded test passes only when the
        process says so AND every observation holds; an unblinded one fails if it reached a blinded
        check (which no longer asserts in the graded source)."""
        if outcome != "passed":
            return outcome, ""
        if self.canary and test not in self.expected:
            return "failed", "a canary's unblinded test"
        if test not in self.expected:
            if any(site_id in self.blind for site_id, _ in observed):
                return "failed", "it reached a blinded check on a path the reference did not take"
            return outcome, ""
        expected = self.expected[test]
        if len(observed) != len(expected):
            return "failed", f"observed {len(observed)} checks, the reference {len(expected)}"
        for index, ((site_id, encoded), reference) in enumerate(zip(observed, expected, strict=True)):
            site = self.sites.get(reference.site)
            if site_id != reference.site or site is None:
                return "failed", f"check #{index + 1} is not the one the reference reached"
            if not verdict(site, reference.values, encoded):
                return "failed", f"{site.path}:{site.line}: observed {_shown(encoded, reference.values)}"
        return "passed", ""


def _flips(site: Site, expected: Expected) -> bool:
    """Whether perturbing this check's expected values makes it fail for the value the reference computed
    (an equality, a truth, a raised class, a pattern, ...), so a canary test holding it fails for honest code.
    A test with none (only `!=`, `<`, `in`, ... or no expected value) fails on the canary outright."""
    if not any(v is not OBSERVED for v in expected.values):
        return False
    if site.kind == "compare":
        return site.ops == ("==",) and not site.negate
    return site.kind in ("truth", "raises", "warns", "regex", "count") or (
        site.kind in ("isclose", "almost") and not site.negate)


def unblinded_key(why: str, *, canary: bool = False) -> Key:
    """A key that blinds nothing (why: `why`); for a canary, one that fails every test."""
    return Key(plan=plan_files({}), expected={}, blind=frozenset(), unblinded={}, reason=why, canary=canary)


def other(value: Any) -> Any:
    """A value unequal to `value` of a kind a test could expect (the canary's key)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float | complex):
        return value + 1 if not (isinstance(value, float) and math.isnan(value)) else 0.0
    if isinstance(value, str):
        return value + "\u2060?"
    if isinstance(value, bytes):
        return value + b"?"
    if isinstance(value, list | tuple):
        return type(value)([*value, None])
    if isinstance(value, set | frozenset):
        return type(value)([*value, ("impossible",)])
    if isinstance(value, dict):
        return {**value, ("impossible",): None}
    if isinstance(value, ClassRef):
        return ClassRef(value.name + ".<impossible>")
    if isinstance(value, Approx):
        return Approx(other(value.expected), value.rel, value.abs, value.nan_ok)
    if isinstance(value, re.Pattern):
        return re.compile("(?!)")  # matches nothing
    return ("impossible", repr(value)[:100])


def verdict(site: Site, reference: Sequence[Any], encoded: Sequence[Any]) -> bool:
    """One check judged here: the reference's expected values, the graded run's observed ones."""
    if site.kind == "truth":
        return len(encoded) == 1 and len(reference) == 1 and decode(encoded[0]) is reference[0]
    caught_count = 1 if site.kind in ("raises", "warns") else 0
    if len(encoded) != len(site.leaves) + caught_count or len(reference) != len(site.leaves):
        return False
    if site.kind in ("regex", "raises", "warns") and len(reference) > 1 and reference[1] is OBSERVED:
        return False  # a pattern the process computed is never compiled here
    values = [decode(value) if ref is OBSERVED else ref for value, ref in zip(encoded, reference, strict=False)]
    caught = decode(encoded[-1]) if caught_count else None
    if any(isinstance(value, Undecodable) for value in values):
        return False
    return _holds(site, values, caught)


def _holds(site: Site, values: list[Any], caught: Any) -> bool:
    options = dict(zip(site.ops, values[2:], strict=False))
    if site.kind == "compare":
        result = holds(site.ops, values)
    elif site.kind == "none":
        result = values[0] is None
    elif site.kind == "isclose":
        result = close(values[0], values[1], options)
    elif site.kind == "almost":
        result = almost_equal(values[0], values[1], options)
    elif site.kind == "regex":
        result = regex_found(values[0], values[1])
    elif site.kind == "count":
        result = same_items(values[0], values[1])
    elif site.kind == "raises":
        return raised_as_expected(values[0], values[1] if len(values) > 1 else None, caught)
    elif site.kind == "warns":
        return warned_as_expected(values[0], values[1] if len(values) > 1 else None, caught)
    else:
        return False
    return result != site.negate


def _shown(encoded: Iterable[Any], reference: Sequence[Any]) -> str:
    values = [decode(value) for value, ref in zip(encoded, list(reference) + [OBSERVED] * 8, strict=False)
              if ref is OBSERVED]
    text = ", ".join(repr(value) for value in values)
    return text if len(text) <= 200 else text[:200] + "…"


def decide(plan: Plan, runs: Sequence[Mapping[str, Any] | None], tests: Iterable[str], *,
           refused: Mapping[str, str] | None = None) -> Key:
    """From the traced reference runs (two or more), which operands are expected and, per test, the
    sequence of values the graded run is compared with. A check is blinded only when every test that
    reached it is blinded (so no unblinded test leans on a check that stopped asserting): a fixed point."""
    tests = list(tests)
    reports = [run or {} for run in runs]
    ledger = Ledger.of(reports)
    leaves = frozenset(lid for module in plan.modules.values() for lid in expected_leaves(module, ledger))
    observed = [observations_of(report) for report in reports]
    outcomes = [dict(r["outcomes"]) if isinstance(r.get("outcomes"), dict) else {} for r in reports]
    reached = {test: {sid for o in observed for sid, _ in o.get(test, [])} for test in tests}
    originals = plan.sites
    sites = dict(originals)
    _by_truth(sites, leaves, (o.get(test, []) for test in tests for o in observed[:1]))
    unblinded: dict[str, str] = dict(refused or {})
    for test in tests:
        if test in unblinded:
            continue
        why = _why_not(sites, originals, leaves, test, [o.get(test) for o in outcomes],
                       [o.get(test, []) for o in observed])
        if why:
            unblinded[test] = why
    changed = True
    while changed:
        bad_sites = {sid for test in unblinded for sid in reached[test]}
        changed = False
        for test in tests:
            if test not in unblinded and reached[test] & bad_sites:
                unblinded[test] = "it reaches a check that an unblinded test reaches too"
                changed = True
    expected = {test: [_expected(sites[sid], originals[sid], leaves, values) for sid, values in observed[0][test]]
                for test in tests if test not in unblinded}
    blind = frozenset(sid for test in expected for sid in reached[test])
    key = Key(plan=plan, expected=expected, blind=blind, unblinded=unblinded, leaves=leaves, sites=sites)
    key.kept = _kept(key)
    return key


def _as_truth(site: Site) -> Site:
    return dataclasses.replace(site, kind="truth", leaves=(), ops=(), negate=False)


def _expected(site: Site, original: Site, leaves: frozenset[str], values: list[Any]) -> Expected:
    if site.kind == "truth" and original.kind != "truth":  # the assert held in the reference run
        return Expected(site.id, (not original.negate,))
    if site.kind == "truth":
        return Expected(site.id, (decode(values[0]),))
    return Expected(site.id, tuple(decode(v) if lid in leaves else OBSERVED
                                   for v, lid in zip(values, site.leaves, strict=False)))


def _by_truth(sites: dict[str, Site], leaves: frozenset[str], sequences: Iterable[list[Observation]]) -> None:
    """A comparison that does not hold when judged by value here (objects with an `__eq__` of their own,
    identity) is judged on its truth instead: `not not (a == b)` reported, the expected truth the key's."""
    for sequence in sequences:
        for sid, values in sequence:
            site = sites.get(sid)
            if site is None or site.kind != "compare":
                continue
            unencodable = len(values) == 1 and isinstance(values[0], list) and values[0][:1] == ["unencodable"]
            if unencodable or (len(values) == len(site.leaves)
                               and not verdict(site, _expected(site, site, leaves, values).values, values)):
                sites[sid] = _as_truth(site)  # too large to carry out, or an `__eq__` of the repository's


def _why_not(sites: dict[str, Site], originals: dict[str, Site], leaves: frozenset[str], test: str,
             outcomes: list[Any], sequences: list[list[Observation]]) -> str:
    """Why `test` cannot be blinded ('' when it can): judged on the reference runs."""
    if any(outcome != "passed" for outcome in outcomes):
        return f"the reference solution does not pass it ({', '.join(str(o) for o in outcomes)})"
    first = sequences[0]
    if not first:
        return NO_CHECK
    if len(first) > MAX_OBSERVATIONS:
        return f"more than {MAX_OBSERVATIONS} checks"
    if any([sid for sid, _ in other] != [sid for sid, _ in first] for other in sequences[1:]):
        return "the reference runs reached its checks in different orders (nondeterministic)"
    for position, (sid, values) in enumerate(first):
        site, original = sites.get(sid), originals.get(sid)
        if site is None or original is None:
            return f"an observation names no known check ({sid[:40]!r})"
        if site.kind == "truth" and original.kind != "truth":
            continue  # judged on its truth: the reference passed it, so the expected truth is the assert's
        width = 1 if original.kind == "truth" else len(original.leaves) + (original.kind in ("raises", "warns"))
        if len(values) != width:
            if values and isinstance(values[0], list) and values[0][:1] == ["unencodable"]:
                return f"{site.path}:{site.line}: an operand could not be carried out of the process ({values[0][1:]})"
            return f"{site.path}:{site.line}: the reference reported {len(values)} operands, not {width}"
        for other in sequences[1:]:
            again = other[position][1]
            if len(again) != len(values) or not all(
                    same(decode(a), decode(b)) for a, b, lid in zip(values, again, original.leaves, strict=False)
                    if lid in leaves):
                return f"{site.path}:{site.line}: an expected value differs between reference runs"
            if original.kind == "truth" and not same(decode(values[0]), decode(again[0])):
                return f"{site.path}:{site.line}: its truth differs between reference runs"
        if site.kind != "truth" and not verdict(site, _expected(site, site, leaves, values).values, values):
            return f"{site.path}:{site.line}: the {site.kind} check cannot be judged by value outside the sandbox"
    return ""


def _kept(key: Key) -> dict[str, str]:
    """Blinded tests with an expected value still in the graded source: a truthiness check that kept a
    literal, or an expected operand whose binding is read elsewhere as an input."""
    removed = {path: spans for path, (_, spans) in key.removed().items()}
    spans = {path: leaf_spans(module) for path, module in key.plan.modules.items()}
    kept: dict[str, str] = {}
    for test, sequence in key.expected.items():
        for reference in sequence:
            site = key.sites[reference.site]
            why = _still_there(site, key, removed[site.path], spans[site.path])
            if why:
                kept[test] = why
                break
    return kept


def _still_there(site: Site, key: Key, removed: set[Position], spans: dict[str, Position]) -> str:
    if site.kind == "truth":
        original = key.plan.sites[site.id]
        probes = _membership_probes(original, key.leaves)
        if original.kind != "truth" and any(lid in key.leaves and lid not in probes for lid in original.leaves):
            return f"{site.path}:{site.line}: a comparison judged on its truth keeps its expected operand"
        return ""
    probes = _membership_probes(site, key.leaves)
    for lid in site.leaves:
        if lid in key.leaves and lid not in probes and _value_kept(key.plan.modules[site.path], lid, removed, spans,
                                                                    set()):
            return f"{site.path}:{site.line}: an expected value is also read as an input"
    return ""


def _value_kept(module: Module, lid: str, removed: set[Position], spans: dict[str, Position],
                visiting: set[str]) -> bool:
    """Whether the value of expected leaf `lid` is still written in the graded source: a name whose binding
    (an assignment, a loop's table, a parametrize column) is kept because something else reads it. A leaf
    that computes its value (`char.upper()`, `len(s) * 10`) is gone with its computation, whatever its
    ingredients."""
    leaf = module.leaves.get(lid)
    if leaf is None or leaf.alias is None or lid in visiting:
        return False
    visiting.add(lid)
    where = resolve(module, leaf.scope, leaf.alias)
    for binding in module.bindings.get((where, leaf.alias), []) if where is not None else []:
        for bound in binding.leaves:
            span = spans.get(bound)
            if span is not None and not within(span, removed):
                return True
            if _value_kept(module, bound, removed, spans, visiting):
                return True
    return False


def _membership_probes(site: Site, leaves: frozenset[str]) -> set[str]:
    """In `needle in container` on a container the repository computed (`assertNotIn(2, cache)`), the needle is
    what the test asks about, not what it expects: the expected value is the answer, the hidden truth."""
    if site.kind != "compare" or len(site.ops) != 1 or site.ops[0] not in ("in", "not in"):
        return set()
    needle, container = site.leaves
    return {needle} if container not in leaves else set()


def canonical(value: Any) -> str:
    """A stable text of a plan's inputs, for caching a task's key."""
    return json.dumps(value, sort_keys=True, default=str)
