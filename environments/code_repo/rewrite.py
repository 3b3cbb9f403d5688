"""A test file rewritten twice: for the trusted reference run, and for the graded sandbox.

    reference = reference_source(source, module)                    # every check also reports its operands
    graded = graded_source(source, module, blind=..., expected=..., removal=removals(...))  # removals.py

Reference: every leaf (checks.py) is wrapped so the run records its value and whether code of the
repository ran while it was computed (`__crucible_leaf__(id, __crucible_mark__(), expr)`); every import
reports which module it bound; every check reports its operands to `__crucible_check__` and then asserts
exactly as before, so the reference's verdicts are the file's own.

Graded: each blinded check only reports what the submission computed — its expected operands are gone
(`None` in their place), a truthiness check reports `not not (expr)` with its polarity gone, a raises /
warns block catches and reports whatever was raised — and nothing asserts. Bindings read only by
what was removed go too (`pass`), parametrize columns of expected values become None (the table copied
into the decorator when it was read by name), with neutral ids, and docstrings and assert messages go.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

from environments.code_repo.checks import (
    COMPARE_OPS,
    UNITTEST,
    Module,
    Site,
    conjuncts,
    literal_rows,
    parametrize_args,
    position,
    pytest_check,
    row_cells,
    strip_not,
    unittest_method,
)
from environments.code_repo.removals import Removal

CHECK, LEAF, MARK, ORIGIN = "__crucible_check__", "__crucible_leaf__", "__crucible_mark__", "__crucible_origin__"
RAISES, RAISES_CALL = "__crucible_raises__", "__crucible_raises_call__"
_VALUES = "_crucible_values_"
NEUTRAL_ID = "c{}"
"""The id each row of a rewritten parametrize table gets (its expected columns are gone from its id too)."""


def _op(op: str) -> ast.cmpop:
    return next(cls() for cls, name in COMPARE_OPS.items() if name == op)


def _call(name: str, *args: ast.expr, keywords: list[ast.keyword] | None = None) -> ast.Call:
    return ast.Call(ast.Name(name, ast.Load()), list(args), keywords or [])


def _const(value: Any) -> ast.Constant:
    return ast.Constant(value)


def _values(index: int) -> ast.Subscript:
    return ast.Subscript(ast.Name(_VALUES, ast.Load()), _const(index), ast.Load())


class _Rewriter(ast.NodeTransformer):
    def __init__(self, module: Module, *, graded: bool, blind: frozenset[str] = frozenset(),
                 expected: frozenset[str] = frozenset(), removal: Removal | None = None) -> None:
        self.m, self.graded, self.blind, self.expected = module, graded, blind, expected
        self.removal = removal or Removal()
        self.rows = {name: rows for name, rows in module.table_rows.items()}

    def _lid(self, node: ast.AST) -> str | None:
        return self.m.ids.get(("leaf", position(node)))

    def _sid(self, node: ast.AST) -> str | None:
        return self.m.ids.get(("site", position(node)))

    def _site_blind(self, sid: str | None) -> bool:
        return sid is not None and sid in self.blind

    # -- leaves and imports ---------------------------------------------------------------------------------
    def generic_visit(self, node: ast.AST) -> ast.AST:
        lid = self._lid(node) if isinstance(node, ast.expr) else None
        node = super().generic_visit(node)
        if lid is not None and not self.graded:
            return _call(LEAF, _const(lid), _call(MARK), node)  # type: ignore[arg-type]
        return node

    def _import(self, node: ast.Import | ast.ImportFrom) -> Any:
        if self.graded or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            return node
        oid = self.m.ids.get(("origin", position(node)))
        if oid is None:
            return node
        package = ast.Call(ast.Attribute(ast.Call(ast.Name("globals", ast.Load()), [], []), "get", ast.Load()),
                           [_const("__package__")], [])
        if isinstance(node, ast.ImportFrom):
            return [node, ast.Expr(_call(ORIGIN, _const(oid), package, _const(node.level), _const(node.module or "")))]
        out: list[ast.stmt] = [node]
        for alias in node.names:
            module = alias.name if alias.asname else alias.name.split(".", 1)[0]
            out.append(ast.Expr(_call(ORIGIN, _const(f"{oid}.{alias.name}"), package, _const(0), _const(module))))
        return out

    visit_Import = visit_ImportFrom = _import

    # -- statements ----------------------------------------------------------------------------------------
    def visit_Assign(self, node: ast.Assign) -> Any:
        if self.graded and position(node) in self.removal.statements:
            return ast.Pass()
        return self.generic_visit(node)

    visit_AnnAssign = visit_Assign  # type: ignore[assignment]

    def visit_Assert(self, node: ast.Assert) -> Any:
        parts = conjuncts(node.test)
        aid = self.m.ids.get(("site", position(node)))
        sids = [f"{aid}.{i}" for i in range(len(parts))] if aid else []
        if not sids or any(sid not in self.m.sites for sid in sids):
            return self.generic_visit(node)
        if self.graded and not all(sid in self.blind for sid in sids):
            return self.generic_visit(node)
        out: list[ast.stmt] = []
        for sid, part in zip(sids, parts, strict=True):
            out += self._expression_check(self.m.sites[sid], part, node.msg)
        return out

    def _expression_check(self, site: Site, part: ast.expr, msg: ast.expr | None) -> list[ast.stmt]:
        inner, negate = strip_not(part)
        if site.kind == "truth":
            truth = ast.UnaryOp(ast.Not(), ast.UnaryOp(ast.Not(), self.visit(inner)))
            if self.graded:
                return [ast.Expr(_call(CHECK, _const(site.id), ast.List([truth], ast.Load())))]
            test: ast.expr = _values(0) if not negate else ast.UnaryOp(ast.Not(), _values(0))
            return [ast.Assign([ast.Name(_VALUES, ast.Store())], ast.List([truth], ast.Load())),
                    ast.Expr(_call(CHECK, _const(site.id), ast.Name(_VALUES, ast.Load()))), ast.Assert(test, msg),
                    ast.Delete([ast.Name(_VALUES, ast.Del())])]
        if site.kind == "compare":
            assert isinstance(inner, ast.Compare)
            operands = [inner.left, *inner.comparators]
            rebuilt: Any = lambda: ast.Compare(_values(0), copy.deepcopy(inner.ops),  # noqa: E731
                                          [_values(i + 1) for i in range(len(inner.ops))])
        else:  # isclose
            assert isinstance(inner, ast.Call)
            operands = [*inner.args, *(k.value for k in inner.keywords)]
            rebuilt = lambda: ast.Call(copy.deepcopy(inner.func), [_values(0), _values(1)],  # noqa: E731
                                       [ast.keyword(k.arg, _values(2 + i)) for i, k in enumerate(inner.keywords)])
        return self._observe(site, operands, lambda: ast.Assert(ast.UnaryOp(ast.Not(), rebuilt()) if negate
                                                                else rebuilt(), msg))

    def _observe(self, site: Site, operands: list[ast.expr], check: Any) -> list[ast.stmt]:
        """Graded: report the operands that are not expected values. Reference: report them all, then
        assert as the test did (`check` builds that statement on `_crucible_values_`)."""
        if self.graded:
            shown = [_const(None) if self._lid(o) in self.expected else self.visit(o) for o in operands]
            return [ast.Expr(_call(CHECK, _const(site.id), ast.List(shown, ast.Load())))]
        visited = [self.visit(o) for o in operands]
        return [ast.Assign([ast.Name(_VALUES, ast.Store())], ast.List(visited, ast.Load())),
                ast.Expr(_call(CHECK, _const(site.id), ast.Name(_VALUES, ast.Load()))), check(),
                ast.Delete([ast.Name(_VALUES, ast.Del())])]  # the operands live no longer than in the test

    def visit_Expr(self, node: ast.Expr) -> Any:
        if self.graded and position(node) in self.removal.statements:  # an in-place change of a removed value
            return ast.Pass()
        method = unittest_method(node.value)
        sid = self._sid(node.value)
        if method is None or sid is None or sid not in self.m.sites or (self.graded and sid not in self.blind):
            return self.generic_visit(node)
        call = node.value
        assert isinstance(call, ast.Call)
        site = self.m.sites[sid]
        kind, _, _, arity = UNITTEST[method]
        msg = next((k.value for k in call.keywords if k.arg == "msg"), None)
        if msg is None and len(call.args) == arity + (2 if kind == "almost" else 1):
            msg = call.args[-1]
        if site.kind == "truth":
            if kind == "truth":
                test: ast.expr = call.args[0]
            elif kind == "instance":
                test = ast.Call(ast.Name("isinstance", ast.Load()), call.args[:2], [])
            else:  # a comparison judged on its truth (identity with something that is not a singleton)
                test = ast.Compare(call.args[0], [_op(UNITTEST[method][1][0])], [call.args[1]])
            negate = UNITTEST[method][2]
            return self._expression_check(site, ast.UnaryOp(ast.Not(), test) if negate else test, msg)
        operands = list(call.args[:arity])
        names = list(site.ops) if site.kind == "almost" else []
        if site.kind == "almost":
            operands += call.args[arity:arity + 1] if "places" in names and call.args[arity:arity + 1] else []
            operands += [k.value for k in call.keywords if k.arg in names and k.arg != "msg"]

        def again() -> ast.stmt:
            keywords = [ast.keyword(name, _values(arity + i)) for i, name in enumerate(names)]
            keywords += [ast.keyword("msg", msg)] if msg is not None else []
            return ast.Expr(ast.Call(copy.deepcopy(call.func), [_values(i) for i in range(arity)], keywords))
        return self._observe(site, operands, again)

    def visit_With(self, node: ast.With) -> Any:
        if len(node.items) == 1:
            call = node.items[0].context_expr
            sid = self._sid(call)
            if sid in self.m.sites and (not self.graded or sid in self.blind):
                site = self.m.sites[sid]
                assert isinstance(call, ast.Call)
                node.items[0].context_expr = _call(RAISES, _const(sid), self._leaf_list(site, call),
                                                   _const(site.kind), _const(site.style))
                body: list[ast.stmt] = []
                for stmt in node.body:
                    visited = self.visit(stmt)
                    body += visited if isinstance(visited, list) else [visited] if visited is not None else []
                node.body = body or [ast.Pass()]
                return node
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> Any:
        sid = self._sid(node)
        if pytest_check(node, self.m.aliases) and sid in self.m.sites and (not self.graded or sid in self.blind):
            site = self.m.sites[sid]
            used = len(site.leaves)
            rest = [self.visit(arg) for arg in node.args[used:]]
            keywords = [ast.keyword(k.arg, self.visit(k.value)) for k in node.keywords
                        if k.arg not in ("expected_exception", "expected_warning", "msg")]
            return ast.Call(ast.Name(RAISES_CALL, ast.Load()),
                            [_const(sid), self._leaf_list(site, node), _const(site.style), *rest], keywords)
        return self.generic_visit(node)

    def _leaf_list(self, site: Site, call: ast.Call) -> ast.List:
        """The expected exception (or warning) and, when given, the pattern: as the analysis found them."""
        keywords = {k.arg: k.value for k in call.keywords}
        first = call.args[0] if call.args else keywords.get("expected_exception", keywords.get("expected_warning"))
        nodes = [first] + ([call.args[1] if len(call.args) > 1 and site.style == "unittest" else keywords["match"]]
                           if len(site.leaves) > 1 else [])
        shown = [_const(None) if self.graded and self._lid(n) in self.expected else self.visit(n)
                 for n in nodes if n is not None]
        return ast.List(shown, ast.Load())

    # -- parametrize tables ----------------------------------------------------------------------------------
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> Any:
        if self.graded:
            node.decorator_list = [self._table(d) for d in node.decorator_list]
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _function  # type: ignore[assignment]

    def _table(self, decorator: ast.expr) -> ast.expr:
        tid = self.m.ids.get(("table", position(decorator)))
        dropped = self.removal.columns.get(tid or "")
        parsed = parametrize_args(decorator, self.m.aliases)
        if dropped is None or parsed is None or not isinstance(decorator, ast.Call):
            return decorator
        argnames, values = parsed
        rows = self.rows[values.id] if isinstance(values, ast.Name) else literal_rows(values)
        assert rows is not None
        new_rows: list[ast.expr] = []
        for row in rows:
            cells = row_cells(row, len(argnames), self.m.aliases)
            assert cells is not None
            kept = [_const(None) if i in dropped else copy.deepcopy(cell) for i, cell in enumerate(cells)]
            if isinstance(row, ast.Call):  # pytest.param: its marks stay, its id goes with a dropped column
                new_rows.append(ast.Call(copy.deepcopy(row.func), kept,
                                         [copy.deepcopy(k) for k in row.keywords if k.arg != "id" or not dropped]))
            else:
                new_rows.append(kept[0] if len(argnames) == 1 else ast.Tuple(kept, ast.Load()))
        keywords = [k for k in decorator.keywords if k.arg not in ("argnames", "argvalues")]
        if dropped:  # the ids pytest would make show the values: every row gets a neutral one
            keywords = [k for k in keywords if k.arg != "ids"]
            keywords.append(ast.keyword("ids", ast.List([_const(NEUTRAL_ID.format(i)) for i in range(len(rows))],
                                                        ast.Load())))
        return ast.Call(decorator.func, [_const(",".join(argnames)), ast.List(new_rows, ast.Load())], keywords)


class _Docstrings(ast.NodeTransformer):
    """Docstrings of the module, of test functions and of test classes go from the graded source: a test's
    prose may state what it expects. Others stay: a test may read them (`X.__doc__ == "success"`)."""

    def _strip(self, node: Any) -> Any:
        self.generic_visit(node)
        name = getattr(node, "name", "test")
        if not (name.startswith("test") or name.startswith("Test")):
            return node
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip


def reference_source(source: str, module: Module) -> str:
    tree = _Rewriter(module, graded=False).visit(ast.parse(source, filename=module.path))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def graded_source(source: str, module: Module, *, blind: frozenset[str], expected: frozenset[str],
                  removal: Removal) -> str:
    tree = _Rewriter(module, graded=True, blind=blind, expected=expected, removal=removal).visit(
        ast.parse(source, filename=module.path))
    tree = _Docstrings().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
