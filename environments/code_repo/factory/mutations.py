"""Procedural bugs: AST-level mutations of one function, spliced into the source text.

    for mutation in mutations(path, source, covered={12, 40}):   # `def` lines of the functions the tests ran
        broken = mutation.apply(source)

Each operator is one kind of slip a programmer makes (SWE-smith's procedural modifications, written
here on the standard `ast` module): a comparison flipped, a condition dropped or negated, a bound off by
one, two arguments swapped, an operator or a constant changed, a statement removed. A mutation replaces
exactly the source span of the node it changes (or the lines of the statement it removes), so the rest
of the file, comments and layout included, is byte for byte the original: the diff a task's reference
solution undoes is the bug and nothing else. A mutation whose result does not parse, or parses to the
same tree as the original, is never offered.

Only code inside a function whose `def` line (or first decorator line) is in `covered` is mutated: the
factory passes the functions its test run entered, so every mutation can change some test's outcome.
Nothing under an f-string is touched (Python 3.11 gives no reliable positions inside one).
"""

from __future__ import annotations

import ast
import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from environments.code_repo.factory.operators import Candidate, Sites, Spans, candidates, removals

OPERATORS = ("flip_comparison", "negate_condition", "drop_condition", "off_by_one", "swap_arguments",
             "change_operator", "change_constant", "remove_statement")
"""Every operator, in the order the report lists them."""

MAX_SOURCE_CHARS = 400_000
"""Files longer than this are not mutated."""
MAX_PER_FUNCTION = 12
"""At most this many mutations of one function are offered (spread over its operators), so that one long
function does not fill a package's budget."""


@dataclass(frozen=True)
class Mutation:
    """One bug: replace `source[start:end]` (character offsets) with `replacement`."""

    path: str
    operator: str
    function: str
    line: int
    start: int
    end: int
    replacement: str

    def apply(self, source: str) -> str:
        return source[:self.start] + self.replacement + source[self.end:]

    @property
    def key(self) -> str:
        """Stable identity within a package version (path, place, and what replaces it)."""
        text = f"{self.path}\0{self.start}\0{self.end}\0{self.replacement}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of every function and method, nested ones included."""
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def first_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
    """The lines a code object of `function` may report as its first: the `def`, or its first decorator."""
    return {function.lineno, *(d.lineno for d in function.decorator_list[:1])}


def mutations(path: str, source: str, *, covered: set[int] | None = None,
              operators: tuple[str, ...] = OPERATORS, per_function: int = MAX_PER_FUNCTION) -> list[Mutation]:
    """Every valid mutation of `source` (the file at `path`) by `operators`, in covered functions only
    (None: all), at most `per_function` of each function spread over its operators, in source order."""
    if len(source) > MAX_SOURCE_CHARS:
        return []  # each check re-parses the module: a huge generated file would cost hours
    try:
        tree = ast.parse(source)
        original = ast.dump(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    spans = Spans(source)
    sites = Sites(tree, spans)
    found: list[Mutation] = []
    for name, function in functions(tree):
        if covered is not None and not first_lines(function) & covered:
            continue
        by_operator: dict[str, list[Candidate]] = {}
        seen: set[tuple[int, int, str]] = set()
        for candidate in [*candidates(function, sites), *removals(function, spans)]:
            operator, _, start, end, replacement, _ = candidate
            if operator in operators and (start, end, replacement) not in seen:
                seen.add((start, end, replacement))
                by_operator.setdefault(operator, []).append(candidate)
        found.extend(_spread(path, name, by_operator, per_function, source=source, original=original,
                             rng=random.Random(f"{path}:{name}")))
    return sorted(found, key=lambda m: (m.start, m.operator, m.replacement))


def _valid(mutation: Mutation, source: str, *, original: str, intended: Callable[[], str] | None) -> bool:
    """The edited text parses, differs from the original, and (where the change is one node's) is exactly
    the tree with that node changed: never a precedence slip that means something else."""
    try:
        changed = ast.dump(ast.parse(mutation.apply(source)))
        return changed != original and (intended is None or changed == intended())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def _spread(path: str, function: str, by_operator: dict[str, list[Candidate]], limit: int, *, source: str,
            original: str, rng: random.Random) -> list[Mutation]:
    """Round-robin over the operators, so a function's budget is not all one kind of bug, each operator's
    sites in a seeded order (not only the first lines of a long function); a site is checked (_valid)
    only when its turn comes, so a long function costs `limit` checks, not one per site."""
    chosen: list[Mutation] = []
    queues = [rng.sample(items, len(items)) for _, items in sorted(by_operator.items())]
    while len(chosen) < limit and any(queues):
        for queue in queues:
            while queue and len(chosen) < limit:
                operator, line, start, end, replacement, intended = queue.pop(0)
                mutation = Mutation(path=path, operator=operator, function=function, line=line, start=start, end=end,
                                    replacement=replacement)
                if _valid(mutation, source, original=original, intended=intended):
                    chosen.append(mutation)
                    break
    return chosen

