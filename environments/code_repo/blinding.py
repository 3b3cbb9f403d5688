"""Blinded hidden tests: the expected values of plain asserts never enter the graded sandbox.

    plan = plan_files({"test_hidden.py": source})        # candidate sites, reference sources
    # trusted sandbox: base + the task's reference solution + plan.reference_files(), run twice
    key = decide(plan, [run_1, run_2])                    # what the reference computed, site by site
    graded = key.graded_files()                           # sent to the graded sandbox
    verdicts = key.judge(outcomes, observations)          # per test id, outside the sandbox

A *site* is an `assert` whose test is a comparison (`==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`, `is`
/ `is not` a singleton) with at least one *static* operand: a literal, or containers and arithmetic of
literals — the value the test expects. In the graded source each site becomes

    __crucible_check__("s3", [add(2, 3), None])            # the expected operand is gone

so the code under test can find the expected value in no file, frame, constant or message of its
process: docstrings and assert messages are removed too. The observed operands are encoded by value
(observations.py), reported, and compared here with the values the reference solution's run gave the
static operands. A site is blinded only when both reference runs observed it identically, in the same
order within each test, and the comparison judged outside holds for the reference — otherwise it stays a
plain assert and its test is graded from the in-process report, named `unblinded` with the reason.

A graded test passes when the in-process report says passed (corroboration) AND its sequence of
observations matches the reference's site for site with every comparison holding. A forged report, a
rewritten runner or a process that kills itself can claim only values the submission computed.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from environments.code_repo.observations import MAX_OBSERVATIONS, decode, holds, same

CHECK = "__crucible_check__"
_VALUES = "_crucible_values_"
_OPS: dict[type[ast.cmpop], str] = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
    ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}
_STATIC = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.expr_context,
           ast.unaryop, ast.operator)


@dataclass(frozen=True)
class Site:
    id: str
    path: str
    line: int
    ops: tuple[str, ...]
    static: tuple[bool, ...]
    """Per operand: True for an expected value (removed from the graded source)."""


def is_static(node: ast.AST) -> bool:
    """A value the test states (a literal, containers and arithmetic of literals): code under test
    plays no part in it."""
    return all(isinstance(child, _STATIC) for child in ast.walk(node)) and not any(
        isinstance(child, ast.Dict) and None in child.keys for child in ast.walk(node))


def _site_of(node: ast.Assert, *, sid: str, path: str) -> Site | None:
    test = node.test
    if not isinstance(test, ast.Compare):
        return None
    ops = tuple(_OPS.get(type(op), "") for op in test.ops)
    operands = [test.left, *test.comparators]
    static = tuple(is_static(operand) for operand in operands)
    if "" in ops or not any(static):
        return None
    for i, op in enumerate(ops):  # identity is judged outside only against a singleton
        if op in ("is", "is not") and not any(isinstance(o, ast.Constant) and o.value in (None, True, False, ...)
                                              for o in operands[i:i + 2]):
            return None
    return Site(sid, path, node.lineno, ops, static)


class _Sites(ast.NodeTransformer):
    """Rewrites each site: `mode` reference records every operand, then asserts as before; graded
    records the observed operands only, for the sites in `blind` (the others stay plain asserts)."""

    def __init__(self, *, path: str, prefix: str, mode: str, blind: frozenset[str] | None = None) -> None:
        self.path, self.prefix, self.mode, self.blind = path, prefix, mode, blind
        self.count = 0
        self.sites: dict[str, Site] = {}

    def visit_Assert(self, node: ast.Assert) -> Any:
        self.count += 1
        site = _site_of(node, sid=f"{self.prefix}{self.count}", path=self.path)
        if site is None:
            return node
        self.sites[site.id] = site
        test = node.test
        assert isinstance(test, ast.Compare)
        operands = [test.left, *test.comparators]
        if self.mode == "graded":
            if self.blind is None or site.id not in self.blind:
                return node
            observed = [ast.Constant(None) if static else operand for operand, static in zip(operands, site.static, strict=True)]
            return ast.Expr(_check(site.id, ast.List(observed, ast.Load())))
        values = ast.Name(_VALUES, ast.Load())
        chain = ast.Compare(ast.Subscript(values, ast.Constant(0), ast.Load()), list(test.ops),
                            [ast.Subscript(values, ast.Constant(i + 1), ast.Load()) for i in range(len(test.ops))])
        return [ast.Assign([ast.Name(_VALUES, ast.Store())], ast.List(operands, ast.Load())),
                ast.Expr(_check(site.id, values)), ast.Assert(chain, node.msg)]


def _check(sid: str, values: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(CHECK, ast.Load()), [ast.Constant(sid), values], [])


class _Docstrings(ast.NodeTransformer):
    """Docstrings go from the graded source: a test's prose may state what it expects."""

    def _strip(self, node: Any) -> Any:
        self.generic_visit(node)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip


def _rewrite(source: str, *, path: str, prefix: str, mode: str, blind: frozenset[str] | None = None,
             ) -> tuple[str, dict[str, Site]]:
    tree = ast.parse(source, filename=path)
    sites = _Sites(path=path, prefix=prefix, mode=mode, blind=blind)
    tree = sites.visit(tree)
    if mode == "graded":
        tree = _Docstrings().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", sites.sites


@dataclass
class Plan:
    """The hidden test files, parsed: each file's candidate sites and its reference source."""

    sources: dict[str, str]
    sites: dict[str, Site] = field(default_factory=dict)
    reference: dict[str, str] = field(default_factory=dict)
    unparsed: list[str] = field(default_factory=list)
    """Test files that are not Python we can parse: passed on as they are, nothing in them is blinded."""

    def reference_files(self) -> dict[str, str]:
        return {**self.sources, **self.reference}


def plan_files(files: Mapping[str, str]) -> Plan:
    plan = Plan(sources=dict(files))
    for index, (path, source) in enumerate(sorted(files.items())):
        if not path.endswith(".py"):
            continue
        try:
            reference, sites = _rewrite(source, path=path, prefix=f"f{index}s", mode="reference")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            plan.unparsed.append(path)
            continue
        plan.reference[path] = reference
        plan.sites.update(sites)
    return plan


Observation = tuple[str, list[Any]]
"""(site id, the encoded operands) as one assert reported them."""


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
    """What the reference computed at one observation: the site and its static operands' values."""

    site: str
    values: tuple[Any, ...]


@dataclass
class Key:
    """Everything the comparator needs (kept in the worker, never sent to the graded sandbox)."""

    plan: Plan
    expected: dict[str, list[Expected]]
    """Per blinded test id: the reference's observations, in order."""
    blind: frozenset[str]
    unblinded: dict[str, str]
    """Test id → why it is graded from the in-process report alone."""
    reason: str = "the reference run did not collect it"
    """Why a test named nowhere above is unblinded."""

    def graded_files(self) -> dict[str, str]:
        files = dict(self.plan.sources)
        for index, (path, source) in enumerate(sorted(self.plan.sources.items())):
            if path in self.plan.reference:
                files[path], _ = _rewrite(source, path=path, prefix=f"f{index}s", mode="graded", blind=self.blind)
        return files

    def judge(self, test: str, outcome: str, observed: Sequence[Observation]) -> tuple[str, str]:
        """A test's outcome and why it differs from the process's: a blinded test passes only when the
        process says so AND every observation holds; an unblinded one fails if it reached a blinded
        assert (which no longer asserts in the graded source)."""
        if outcome != "passed":
            return outcome, ""
        if test not in self.expected:
            if any(site_id in self.blind for site_id, _ in observed):
                return "failed", "it reached a blinded assert on a path the reference did not take"
            return outcome, ""
        expected = self.expected[test]
        if len(observed) != len(expected):
            return "failed", f"observed {len(observed)} blinded asserts, the reference {len(expected)}"
        for index, ((site_id, encoded), reference) in enumerate(zip(observed, expected, strict=True)):
            site = self.plan.sites.get(reference.site)
            if site_id != reference.site or site is None or len(encoded) != len(site.static):
                return "failed", f"assert #{index + 1} is not the one the reference reached"
            values = [ref if static else decode(value)
                      for value, ref, static in zip(encoded, reference.values, site.static, strict=True)]
            if not holds(site.ops, values):
                shown = _shown([value for value, static in zip(values, site.static, strict=True) if not static])
                return "failed", f"{site.path}:{site.line}: observed {shown}"
        return "passed", ""


def _shown(values: Iterable[Any]) -> str:
    text = ", ".join(repr(value) for value in values)
    return text if len(text) <= 200 else text[:200] + "…"


def decide(plan: Plan, runs: Sequence[Mapping[str, Any] | None], tests: Iterable[str]) -> Key:
    """From the reference runs' reports (two or more), the sites that can be blinded and, per test, the
    sequence of expected values the graded run is compared with. A site is blinded only when every test
    that reached it in the reference runs is blinded (so no unblinded test leans on an assert that
    stopped asserting); that is a fixed point, reached in at most one pass per test."""
    tests = list(tests)
    reports = [run or {} for run in runs]
    observed = [observations_of(report) for report in reports]
    outcomes: list[dict[str, Any]] = [dict(report["outcomes"]) if isinstance(report.get("outcomes"), dict) else {}
                                      for report in reports]
    reached = {test: {sid for o in observed for sid, _ in o.get(test, [])} for test in tests}
    unblinded: dict[str, str] = {}
    bad_sites: set[str] = set()
    for test in tests:
        why = _why_not(plan, test, [o.get(test) for o in outcomes], [o.get(test, []) for o in observed])
        if why:
            unblinded[test] = why
    changed = True
    while changed:
        bad_sites = {sid for test in unblinded for sid in reached[test]}
        changed = False
        for test in tests:
            if test not in unblinded and reached[test] & bad_sites:
                unblinded[test] = "it reaches an assert that an unblinded test reaches too"
                changed = True
    expected = {test: [Expected(sid, tuple(decode(v) if static else None
                                           for v, static in zip(values, plan.sites[sid].static, strict=True)))
                       for sid, values in observed[0][test]]
                for test in tests if test not in unblinded}
    blind = frozenset(sid for test in expected for sid in reached[test])
    return Key(plan=plan, expected=expected, blind=blind, unblinded=unblinded)


def _why_not(plan: Plan, test: str, outcomes: list[Any], sequences: list[list[Observation]]) -> str:
    """Why `test` cannot be blinded ('' when it can): judged on the reference runs."""
    if any(outcome != "passed" for outcome in outcomes):
        return f"the reference solution does not pass it ({', '.join(str(o) for o in outcomes)})"
    first = sequences[0]
    if not first:
        return "no assert with an expected value was reached"
    if len(first) > MAX_OBSERVATIONS:
        return f"more than {MAX_OBSERVATIONS} asserts"
    if any([sid for sid, _ in other] != [sid for sid, _ in first] for other in sequences[1:]):
        return "the reference runs reached its asserts in different orders (nondeterministic)"
    for position, (sid, values) in enumerate(first):
        site = plan.sites.get(sid)
        if site is None or len(values) != len(site.static):
            return f"an observation names no known assert ({sid[:40]!r})"
        decoded = [decode(v) for v in values]
        for other in sequences[1:]:
            again = [decode(v) for v in other[position][1]]
            if len(again) != len(decoded) or not all(same(a, b) for a, b, s in zip(decoded, again, site.static, strict=True) if s):
                return f"{site.path}:{site.line}: the expected value differs between reference runs"
        if not holds(site.ops, decoded):
            return f"{site.path}:{site.line}: the comparison cannot be judged by value outside the sandbox"
    return ""


def canonical(value: Any) -> str:
    """A stable text of a plan's inputs, for caching a task's key."""
    return json.dumps(value, sort_keys=True, default=str)
