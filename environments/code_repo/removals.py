"""What a graded test file leaves out beyond its blinded checks' expected operands (rewrite.py writes
it): the assignments that only what was removed read (replaced by `pass`) and the parametrize columns of
expected values (a table read by name copied into every decorator that reads it, each copy losing its own
expected columns), with the spans of everything removed.

    removal, spans = removals(source, module, blind=..., expected=...)
    within(position, spans)       # a leaf the graded file no longer holds
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

from environments.code_repo.checks import (
    Module,
    Position,
    leaf_spans,
    mutated_name,
    parametrize_args,
    position,
    reads_of,
    resolve,
)


@dataclass
class Removal:
    """What the graded source leaves out beyond the checks' expected operands."""

    statements: set[Position] = field(default_factory=set)
    """Assignments replaced by `pass`."""
    columns: dict[str, set[int]] = field(default_factory=dict)
    """Table id → the columns whose cells become None (a table named here is copied into its decorator,
    with neutral ids, even when no column of its own goes)."""


def within(point: Position, spans: Iterable[Position]) -> bool:
    """Whether `point` lies in one of `spans`."""
    start = point[:2]
    return any(span[:2] <= start and point[2:] <= span[2:] for span in spans)


def removals(source: str, module: Module, *, blind: frozenset[str], expected: frozenset[str],
             reported: frozenset[str] = frozenset()) -> tuple[Removal, set[Position]]:
    """The assignments and parametrize columns the graded source can leave out once the blinded checks'
    expected operands are gone (a binding goes when everything that reads it went; a table read by name is
    copied into every decorator that reads it, each copy losing its own expected columns), and the spans of
    everything removed."""
    tree = ast.parse(source, filename=module.path)
    spans: set[Position] = set()
    leaf_span = leaf_spans(module)
    for sid in blind:
        site = module.sites.get(sid)
        for lid in site.leaves if site else ():
            if lid in expected:
                spans.add(leaf_span[lid])
    for sid in reported:  # a check that only reports drops its failure message
        if sid in module.messages:
            spans.add(module.messages[sid])
    assigns, changes = _assignments(tree, module)
    tables = _decorators(tree, module)
    removal = Removal()
    changed = True
    while changed:
        changed = False
        for stmt_pos, (scope, names, value) in assigns.items():
            if stmt_pos in removal.statements:
                continue
            # The name's in-place changes (`ref.update(x)`) go with it: reads inside them are not reads.
            own = [span for (s, n), found in changes.items() if s == scope and n in names for span in found]
            reads = [r for name in names for r in reads_of(module, scope, name) if not within(r, own)]
            if reads and all(within(r, spans) for r in reads):
                removal.statements.add(stmt_pos)
                removal.statements.update(own)
                spans.add(value)
                spans.update(own)
                changed = True
        for tid, table in module.tables.items():
            if table.rows is None or tid not in tables:
                continue
            for column, name in enumerate(table.argnames):
                if column in removal.columns.get(tid, set()):
                    continue
                cells = [row[column] for row in table.rows]
                reads = module.reads.get((table.function, name), [])
                if all(cell in expected for cell in cells) and all(within(r, spans) for r in reads):
                    removal.columns.setdefault(tid, set()).add(column)
                    spans.update(leaf_span[cell] for cell in cells)
                    for other, shared in module.tables.items():  # every reader of the name gets a copy
                        if table.source and shared.source == table.source and other in tables:
                            removal.columns.setdefault(other, set())
                            spans.add(tables[other])
                    spans.add(tables[tid])
                    changed = True
    return removal, spans




def _assignments(tree: ast.Module, module: Module) -> tuple[dict[Position, tuple[str, list[str], Position]],
                                                              dict[tuple[str, str], list[Position]]]:
    """Assignments whose targets are plain names: position → (scope, names, the value's span); and per
    (scope, name) the statements that change the named object in place (checks.mutated_name)."""
    out: dict[Position, tuple[str, list[str], Position]] = {}
    changes: dict[tuple[str, str], list[Position]] = {}

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scope = module.ids.get(("scope", position(node)), scope)
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) for t in targets):
                out[position(node)] = (scope, [t.id for t in targets if isinstance(t, ast.Name)], position(node.value))
        if isinstance(node, ast.stmt):
            mutation = mutated_name(node)
            if mutation is not None:
                where = resolve(module, scope, mutation[0])
                if where is not None:
                    changes.setdefault((where, mutation[0]), []).append(position(node))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, "")
    return out, changes


def _decorators(tree: ast.Module, module: Module) -> dict[str, Position]:
    """Table id → the span of its argvalues (the part a copy replaces)."""
    out: dict[str, Position] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                tid = module.ids.get(("table", position(decorator)))
                parsed = parametrize_args(decorator, module.aliases)
                if tid and parsed:
                    out[tid] = position(parsed[1])
    return out
