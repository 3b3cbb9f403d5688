"""Where each mutation operator of factory/mutations.py finds its sites in one function: a comparison to
flip, an operator or a constant to change, a condition to drop or negate, two arguments to swap, a
statement to remove. Each site is a Candidate — (operator, line, start, end, replacement, intended) —
that edits the source text only where the bug is; mutations.py checks it (`intended`: the tree it must
parse to) and spreads a function's budget over the operators.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

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


class Spans:
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


class Sites:
    """Mutation sites of one module. A site edits the source text only where the bug is (an operator
    token, a literal, two arguments' text, a `not`), so the rest keeps its spelling; it is kept only when
    the edited text parses to exactly the tree with that one node changed (`intended`)."""

    def __init__(self, tree: ast.Module, spans: Spans) -> None:
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


def candidates(function: ast.FunctionDef | ast.AsyncFunctionDef, sites: Sites) -> Iterator[Candidate]:
    """(operator, line, start, end, replacement, the intended tree's dump when asked) for each mutation site of
    `function`'s own body (not of functions or classes nested in it: they are mutated as their own)."""
    inside_fstring: set[int] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.JoinedStr):
            inside_fstring.update(id(child) for child in ast.walk(node))
    parents = {id(child): parent for parent in ast.walk(function) for child in ast.iter_child_nodes(parent)}
    for statement in function.body:
        for node in [statement, *_own_nodes(statement, inside_fstring)]:
            yield from _nodecandidates(node, sites, parents)


def _own_nodes(root: ast.AST, inside_fstring: set[int]) -> Iterator[ast.AST]:
    """The nodes under `root`, depth first, except nested functions, classes and lambdas and anything under an
    f-string (the ids in `inside_fstring`)."""
    for child in ast.iter_child_nodes(root):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if id(child) in inside_fstring:
            continue
        yield child
        yield from _own_nodes(child, inside_fstring)


def _nodecandidates(node: ast.AST, sites: Sites, parents: dict[int, ast.AST]) -> Iterator[Candidate]:
    """The mutation sites `node` itself offers, by its kind (`parents`: each node's parent, by id)."""
    if isinstance(node, ast.Compare):
        yield from _flipped_comparisons(node, sites)
    elif isinstance(node, ast.BinOp):
        yield from _changed_operator(node, sites)
    elif isinstance(node, ast.BoolOp) and len(node.values) >= 2:
        yield from _dropped_conditions(node, sites)
    elif isinstance(node, ast.Call) and len(node.args) >= 2 \
            and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
        yield from _swapped_arguments(node, sites)
    elif isinstance(node, ast.Constant) and isinstance(node.value, int) and abs(node.value) < 2**31:
        yield from _changed_constant(node, node.value, sites, parents)
    if isinstance(node, ast.If | ast.While) and not isinstance(node.test, ast.Constant):
        yield from _negated_condition(node, sites)


def _flipped_comparisons(node: ast.Compare, sites: Sites) -> Iterator[Candidate]:
    """Each comparison operator of `node` replaced by its opposite (`<` by `>=`, `in` by `not in`)."""
    operands = [node.left, *node.comparators]
    for index, op in enumerate(list(node.ops)):
        flipped = _FLIPPED_COMPARISONS.get(type(op))
        token = sites.token_between(operands[index], operands[index + 1], _SYMBOLS[type(op)])
        if flipped is None or token is None:
            continue
        intended = partial(sites.intended, node.ops, index, flipped())
        yield "flip_comparison", node.lineno, *token, _SYMBOLS[flipped], intended


def _changed_operator(node: ast.BinOp, sites: Sites) -> Iterator[Candidate]:
    """The binary operator of `node` replaced by a near one (`+` by `-`, `*` by `//`)."""
    changed = _CHANGED_OPERATORS.get(type(node.op))
    token = sites.token_between(node.left, node.right, _SYMBOLS[type(node.op)]) if changed else None
    if changed is not None and token is not None:
        intended = partial(sites.intended, node, "op", changed())
        yield "change_operator", node.lineno, *token, _SYMBOLS[changed], intended


def _dropped_conditions(node: ast.BoolOp, sites: Sites) -> Iterator[Candidate]:
    """Each operand of an `and` / `or` removed, with the operator that joins it to its neighbour."""
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


def _swapped_arguments(node: ast.Call, sites: Sites) -> Iterator[Candidate]:
    """The first two positional arguments of a call swapped (their text, the separator between them kept)."""
    source = sites.spans.source
    first, second = sites.segment(node.args[0]), sites.segment(node.args[1])
    if first is not None and second is not None:
        text = source[second[0]:second[1]] + source[first[1]:second[0]] + source[first[0]:first[1]]
        intended = partial(sites.intended, node, "args", [node.args[1], node.args[0], *node.args[2:]])
        yield "swap_arguments", node.lineno, first[0], second[1], text, intended


def _changed_constant(node: ast.Constant, number: int, sites: Sites, parents: dict[int, ast.AST]) -> Iterator[Candidate]:
    """The literal `node` (of value `number`) negated when a boolean, or moved by one either way when an integer
    (never below 0, and never to a 0 that an operator applies to)."""
    place = sites.segment(node)
    values = [not number] if type(number) is bool else [number + d for d in (1, -1) if number + d >= 0]
    for changed_to in values if place is not None else []:
        operator = "change_constant" if type(number) is bool else "off_by_one"
        if changed_to == 0 and isinstance(parents.get(id(node)), ast.BinOp | ast.UnaryOp):
            continue  # `x - 0`, `-0`: a tell that points at the bug
        yield operator, node.lineno, *place, repr(changed_to), partial(sites.intended, node, "value", changed_to)  # type: ignore[misc]


def _negated_condition(node: ast.If | ast.While, sites: Sites) -> Iterator[Candidate]:
    """The test of an `if` / `while` negated: a leading `not` removed, or one added."""
    source = sites.spans.source
    test = node.test
    span = sites.segment(test)
    if span is None:
        return
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = sites.segment(test.operand)
        if inner is None:
            return
        negated: ast.expr = test.operand
        text = source[inner[0]:inner[1]]
    else:
        negated = ast.UnaryOp(op=ast.Not(), operand=test)
        text = source[span[0]:span[1]]
        text = f"not {text}" if isinstance(test, ast.Compare | ast.Name | ast.Call | ast.Attribute
                                           | ast.Subscript) else f"not ({text})"
    intended = partial(sites.intended, node, "test", negated)
    yield "negate_condition", node.lineno, *span, text, intended


def _replaced_dump(sites: Sites, old: ast.expr, new: ast.expr) -> str:
    """The tree's dump with `old` (a child of some node) replaced by `new`."""
    for parent in ast.walk(sites.tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                return sites.intended(parent, field, new)
            if isinstance(value, list) and any(item is old for item in value):
                return sites.intended(value, next(i for i, item in enumerate(value) if item is old), new)
    return ""


def removals(function: ast.FunctionDef | ast.AsyncFunctionDef, spans: Spans) -> Iterator[Candidate]:
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
