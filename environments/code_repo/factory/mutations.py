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
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

OPERATORS = ("flip_comparison", "negate_condition", "drop_condition", "off_by_one", "swap_arguments",
             "change_operator", "change_constant", "remove_statement")
"""Every operator, in the order the report lists them."""

_FLIPPED_COMPARISONS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
_CHANGED_OPERATORS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.LShift: ast.RShift,
    ast.RShift: ast.LShift, ast.Pow: ast.Mult,
}
_REMOVABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.If, ast.For, ast.While, ast.Return, ast.Raise,
              ast.With, ast.Try)
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


_LINE_END = re.compile(r"\r\n|\r|\n")


def _split_lines(source: str) -> list[str]:
    """Lines as Python's tokenizer counts them (str.splitlines also breaks at form feeds, \\x1c-\\x1e,
    \\x85 and the Unicode separators, which would shift every line number after them)."""
    lines, start = [], 0
    for end in _LINE_END.finditer(source):
        lines.append(source[start:end.end()])
        start = end.end()
    if start < len(source):
        lines.append(source[start:])
    return lines


def _offsets(source: str) -> list[int]:
    """Character offset of each line's start (1-based lines, as ast reports them; columns are UTF-8 bytes)."""
    starts, total = [0, 0], 0
    for line in _split_lines(source):
        total += len(line)
        starts.append(total)
    return starts


class _Spans:
    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = _split_lines(source)
        self.starts = _offsets(source)

    def offset(self, line: int, col_bytes: int) -> int:
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return self.starts[line] + len(text.encode()[:col_bytes].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int] | None:
        end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
        if end_line is None or end_col is None:
            return None
        return self.offset(node.lineno, node.col_offset), self.offset(end_line, end_col)  # type: ignore[attr-defined]

    def whole_lines(self, node: ast.stmt) -> tuple[int, int] | None:
        """The span of the lines `node` occupies alone (nothing else before or after it on them)."""
        span = self.span(node)
        if span is None:
            return None
        start, end = span
        line_start = self.starts[node.lineno]
        end_line = node.end_lineno or node.lineno
        line_end = self.starts[end_line + 1] if end_line + 1 < len(self.starts) else len(self.source)
        before, after = self.source[line_start:start], self.source[end:line_end]
        if before.strip() or (after.strip() and not after.strip().startswith("#")):
            return None  # another statement shares a line (`a = 1; b = 2`)
        return line_start, line_end


_SYMBOLS: dict[type[ast.AST], str] = {
    ast.Lt: "<", ast.GtE: ">=", ast.Gt: ">", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
    ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
    ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<",
    ast.RShift: ">>", ast.Pow: "**", ast.And: "and", ast.Or: "or",
}


class _Sites:
    """Mutation sites of one module. A site edits the source text only where the bug is (an operator
    token, a literal, two arguments' text, a `not`), so the rest keeps its spelling; it is kept only when
    the edited text parses to exactly the tree with that one node changed (`intended`)."""

    def __init__(self, tree: ast.Module, spans: _Spans) -> None:
        self.tree, self.spans = tree, spans

    def intended(self, holder: Any, key: str | int, new: Any) -> str:
        """The tree's dump with `holder`'s `key` (an attribute, or a list index) set to `new`."""
        def put(value: Any) -> None:
            if isinstance(key, int):
                holder[key] = value
            else:
                setattr(holder, key, value)

        old = holder[key] if isinstance(key, int) else getattr(holder, key)
        put(new)
        try:
            return ast.dump(self.tree)
        finally:
            put(old)

    def segment(self, node: ast.AST) -> tuple[int, int] | None:
        return self.spans.span(node)

    def token_between(self, left: ast.AST, right: ast.AST, symbol: str) -> tuple[int, int] | None:
        """The span of the operator `symbol` in the text between `left` and `right` (brackets and spaces
        around it allowed, nothing else)."""
        a, b = self.segment(left), self.segment(right)
        if a is None or b is None:
            return None
        gap = self.spans.source[a[1]:b[0]]
        words = gap.replace("(", " ").replace(")", " ").split()
        if " ".join(words) != symbol:
            return None
        at = gap.find(symbol.split()[0])
        end = gap.find(symbol.split()[-1], at) + len(symbol.split()[-1])
        return a[1] + at, a[1] + end


Candidate = tuple[str, int, int, int, str, Callable[[], str] | None]
"""(operator, line, start, end, replacement, the intended tree's dump, computed when asked: None for a removal)."""


def _candidates(function: ast.FunctionDef | ast.AsyncFunctionDef, sites: _Sites) -> Iterator[Candidate]:
    """(operator, line, start, end, replacement, the intended tree's dump when asked) for each mutation site of
    `function`'s own body (not of functions or classes nested in it: they are mutated as their own)."""
    inside_fstring: set[int] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.JoinedStr):
            inside_fstring.update(id(child) for child in ast.walk(node))

    def own_nodes(root: ast.AST) -> Iterator[ast.AST]:
        for child in ast.iter_child_nodes(root):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                continue
            if id(child) in inside_fstring:
                continue
            yield child
            yield from own_nodes(child)

    source = sites.spans.source
    parents = {id(child): parent for parent in ast.walk(function) for child in ast.iter_child_nodes(parent)}
    for statement in function.body:
        for node in [statement, *own_nodes(statement)]:
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for index, op in enumerate(list(node.ops)):
                    flipped = _FLIPPED_COMPARISONS.get(type(op))
                    token = sites.token_between(operands[index], operands[index + 1], _SYMBOLS[type(op)])
                    if flipped is None or token is None:
                        continue
                    intended = partial(sites.intended, node.ops, index, flipped())
                    yield "flip_comparison", node.lineno, *token, _SYMBOLS[flipped], intended
            elif isinstance(node, ast.BinOp):
                changed = _CHANGED_OPERATORS.get(type(node.op))
                token = sites.token_between(node.left, node.right, _SYMBOLS[type(node.op)]) if changed else None
                if changed is not None and token is not None:
                    intended = partial(sites.intended, node, "op", changed())
                    yield "change_operator", node.lineno, *token, _SYMBOLS[changed], intended
            elif isinstance(node, ast.BoolOp) and len(node.values) >= 2:
                for index in range(len(node.values)):
                    value = sites.segment(node.values[index])
                    neighbour = sites.segment(node.values[index - 1] if index else node.values[1])
                    if value is None or neighbour is None:
                        continue
                    start, end = (neighbour[1], value[1]) if index else (value[0], neighbour[0])
                    rest = node.values[:index] + node.values[index + 1:]
                    intended = partial(sites.intended, node, "values", rest) if len(rest) > 1 \
                        else partial(_replaced_dump, sites, node, rest[0])
                    yield "drop_condition", node.lineno, start, end, "", intended
            elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                    and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
                first, second = sites.segment(node.args[0]), sites.segment(node.args[1])
                if first is not None and second is not None:
                    text = source[second[0]:second[1]] + source[first[1]:second[0]] + source[first[0]:first[1]]
                    intended = partial(sites.intended, node, "args", [node.args[1], node.args[0], *node.args[2:]])
                    yield "swap_arguments", node.lineno, first[0], second[1], text, intended
            elif isinstance(node, ast.Constant) and isinstance(node.value, int) and abs(node.value) < 2**31:
                place = sites.segment(node)
                number: int = node.value
                values = [not number] if type(number) is bool else [number + d for d in (1, -1) if number + d >= 0]
                for changed_to in values if place is not None else []:
                    operator = "change_constant" if type(number) is bool else "off_by_one"
                    if changed_to == 0 and isinstance(parents.get(id(node)), ast.BinOp | ast.UnaryOp):
                        continue  # `x - 0`, `-0`: a tell that points at the bug
                    yield operator, node.lineno, *place, repr(changed_to), partial(sites.intended, node, "value", changed_to)  # type: ignore[misc]
            if isinstance(node, ast.If | ast.While) and not isinstance(node.test, ast.Constant):
                test = node.test
                span = sites.segment(test)
                if span is None:
                    continue
                if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                    inner = sites.segment(test.operand)
                    if inner is None:
                        continue
                    negated: ast.expr = test.operand
                    text = source[inner[0]:inner[1]]
                else:
                    negated = ast.UnaryOp(op=ast.Not(), operand=test)
                    text = source[span[0]:span[1]]
                    text = f"not {text}" if isinstance(test, ast.Compare | ast.Name | ast.Call | ast.Attribute
                                                       | ast.Subscript) else f"not ({text})"
                intended = partial(sites.intended, node, "test", negated)
                yield "negate_condition", node.lineno, *span, text, intended


def _replaced_dump(sites: _Sites, old: ast.expr, new: ast.expr) -> str:
    """The tree's dump with `old` (a child of some node) replaced by `new`."""
    for parent in ast.walk(sites.tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                return sites.intended(parent, field, new)
            if isinstance(value, list) and any(item is old for item in value):
                return sites.intended(value, next(i for i, item in enumerate(value) if item is old), new)
    return ""


def _removals(function: ast.FunctionDef | ast.AsyncFunctionDef, spans: _Spans) -> Iterator[Candidate]:
    def blocks(node: ast.AST) -> Iterator[list[ast.stmt]]:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body

    todo: list[ast.AST] = [function]
    while todo:
        node = todo.pop()
        for block in blocks(node):
            for index, statement in enumerate(block):
                if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                todo.append(statement)
                docstring = (node is function and index == 0 and isinstance(statement, ast.Expr)
                             and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str))
                if docstring or not isinstance(statement, _REMOVABLE):
                    continue
                if isinstance(node, ast.If) and block is node.orelse and isinstance(statement, ast.If) \
                        and spans.source[spans.span(statement)[0]:].startswith("elif"):  # type: ignore[index]
                    continue  # an `elif` removed leaves a bare `pass` where no one writes one
                lines = spans.whole_lines(statement)
                if lines is None:
                    continue
                if len(block) == 1 or (len(block) == 2 and block is function.body and index == 1
                                       and _is_docstring(block[0])):
                    first = _split_lines(spans.source[lines[0]:lines[1]])[0]
                    indent = first[:len(first) - len(first.lstrip())]
                    ending = _LINE_END.search(first)
                    yield ("remove_statement", statement.lineno, lines[0], lines[1],
                           f"{indent}pass{ending.group() if ending else ''}", None)
                else:
                    yield "remove_statement", statement.lineno, lines[0], lines[1], "", None


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


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
    spans = _Spans(source)
    sites = _Sites(tree, spans)
    found: list[Mutation] = []
    for name, function in functions(tree):
        if covered is not None and not first_lines(function) & covered:
            continue
        by_operator: dict[str, list[Candidate]] = {}
        seen: set[tuple[int, int, str]] = set()
        for candidate in [*_candidates(function, sites), *_removals(function, spans)]:
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

