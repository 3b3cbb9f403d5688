"""The checks of a test file, found by their syntax, with every operand they judge (its *leaves*) and every
place a name those operands read is bound. Which leaves are expected values is decided later, by tracing
the reference run (blinding.py); this module only says where things are.

    module = analyse(source, path="tests/test_x.py", prefix="f0")
    module.sites      # site id → Site: an assert, a unittest assert* call, a pytest.raises / warns block
    module.leaves     # leaf id → Leaf: an operand, a binding's value, a parametrize table's cell
    module.bindings   # (scope, name) → the Bindings that give the name a value there

A check is any `assert` (comparisons, truthiness, `not`, `and`, `math.isclose`), a unittest `self.assert*`
call, or a `pytest.raises` / `pytest.warns` / `self.assertRaises*` / `self.assertWarns*` block or call. Ids
are derived from positions in the source, so the same source always gives the same ids and the rewrites
(rewrite.py) find every node again by where it is.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field

Position = tuple[int, int, int, int]
COMPARE_OPS: dict[type[ast.cmpop], str] = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
    ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}
_COMPARE = {"==": ["assertEqual", "assertEquals", "failUnlessEqual", "assertListEqual", "assertTupleEqual",
                   "assertSetEqual", "assertDictEqual", "assertSequenceEqual", "assertMultiLineEqual"],
            "!=": ["assertNotEqual", "assertNotEquals", "failIfEqual"], "is": ["assertIs"], "is not": ["assertIsNot"],
            "in": ["assertIn"], "not in": ["assertNotIn"], ">": ["assertGreater"], ">=": ["assertGreaterEqual"],
            "<": ["assertLess"], "<=": ["assertLessEqual"]}
UNITTEST: dict[str, tuple[str, tuple[str, ...], bool, int]] = {
    **{name: ("compare", (op,), False, 2) for op, names in _COMPARE.items() for name in names},
    **dict.fromkeys(["assertTrue", "assert_", "failUnless"], ("truth", (), False, 1)),
    **dict.fromkeys(["assertFalse", "failIf"], ("truth", (), True, 1)),
    "assertIsNone": ("none", (), False, 1), "assertIsNotNone": ("none", (), True, 1),
    "assertIsInstance": ("instance", (), False, 2), "assertNotIsInstance": ("instance", (), True, 2),
    **dict.fromkeys(["assertAlmostEqual", "assertAlmostEquals", "failUnlessAlmostEqual"], ("almost", (), False, 2)),
    **dict.fromkeys(["assertNotAlmostEqual", "assertNotAlmostEquals"], ("almost", (), True, 2)),
    **dict.fromkeys(["assertRegex", "assertRegexpMatches"], ("regex", (), False, 2)),
    "assertNotRegex": ("regex", (), True, 2),
    **dict.fromkeys(["assertCountEqual", "assertItemsEqual"], ("count", (), False, 2)),
}
"""unittest's assert methods: (kind, compare operators, negated, how many operands)."""
UNITTEST_KEYWORDS = {"almost": ("places", "delta")}
"""Keyword arguments (besides `msg`) a kind takes as more leaves."""
RAISES_UNITTEST = {"assertRaises": ("raises", False), "assertRaisesRegex": ("raises", True),
                   "assertRaisesRegexp": ("raises", True), "assertWarns": ("warns", False),
                   "assertWarnsRegex": ("warns", True)}
_SINGLETONS = (None, True, False, ...)
MUTATORS = frozenset({"append", "extend", "insert", "update", "add", "pop", "remove", "discard", "clear", "setdefault",
                      "sort", "reverse", "appendleft", "extendleft", "popitem", "popleft"})
"""Methods that change the object they are called on: `expected.append(x)` is part of how `expected` is built."""


def mutated_name(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    """(name, the expression the change reads) for a statement that changes a named object in place:
    `ref.update(other)`, `ref[key] = value`, `ref.attr = value` (None for anything else)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
            and isinstance(stmt.value.func.value, ast.Name) and stmt.value.func.attr in MUTATORS:
        return stmt.value.func.value.id, stmt.value
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript | ast.Attribute) \
            and isinstance(stmt.targets[0].value, ast.Name):
        return stmt.targets[0].value.id, stmt.value
    return None


def position(node: ast.AST) -> Position:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0), getattr(node, "end_lineno", 0) or 0,
            getattr(node, "end_col_offset", 0) or 0)


@dataclass(frozen=True)
class Leaf:
    id: str
    scope: str
    """"" for the module (and decorators), else the id of the function whose body holds it."""
    names: frozenset[str]
    """The names it reads from its scope (names bound inside it, by a comprehension or a lambda, excluded)."""
    alias: str | None = None
    """The name, when the leaf is nothing but a name (`expected`): its value is its binding's."""
    pure: bool = False
    """It calls nothing, reads no attribute or item: written values and names only. A leaf the reference
    never evaluated (a branch it did not take) can be taken as expected only if it is pure."""
    immutable: bool = False
    """Pure and building no list, dict or set: nothing can change its value after it is bound."""


@dataclass(frozen=True)
class Binding:
    kind: str
    """`value`: an assignment, a loop's iterable or a parametrize column: the name's value comes from `leaves`;
    `import`: the name is a module or something imported from one (`origin`); `opaque`: anything else (a
    parameter filled by a fixture, a def, `with … as`, an augmented assignment, a walrus)."""
    leaves: tuple[str, ...] = ()
    origin: str = ""


@dataclass(frozen=True)
class Site:
    id: str
    path: str
    line: int
    kind: str
    """compare, truth, none, isclose, almost, regex, count, raises or warns."""
    ops: tuple[str, ...] = ()
    """compare: the chain's operators; isclose and almost: the keyword leaves after the two operands."""
    leaves: tuple[str, ...] = ()
    """The operands, in the order the check reports them (truth sites report one bool and have none)."""
    negate: bool = False
    style: str = "pytest"
    """raises: what `as` receives (`pytest`: an ExceptionInfo, `unittest`: a context with `.exception`)."""


@dataclass
class Table:
    """A parametrize decorator: its argument names and, when its rows are a literal the rewrite can copy, the
    leaf id of every cell (row by row)."""

    id: str
    function: str
    argnames: list[str]
    rows: list[list[str]] | None
    source: str = ""
    """"" when the rows are written in the decorator, else the module-level name they are read from."""


@dataclass
class Module:
    path: str
    prefix: str
    sites: dict[str, Site] = field(default_factory=dict)
    leaves: dict[str, Leaf] = field(default_factory=dict)
    bindings: dict[tuple[str, str], list[Binding]] = field(default_factory=dict)
    imports: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Origin id → (module as written, relative level)."""
    tables: dict[str, Table] = field(default_factory=dict)
    table_rows: dict[str, list[ast.expr]] = field(default_factory=dict)
    """Module-level name → the literal rows bound to it (for tables read by name)."""
    ids: dict[tuple[str, Position], str] = field(default_factory=dict)
    """(role, position) → id: how a rewrite finds a node's id again."""
    reads: dict[tuple[str, str], list[Position]] = field(default_factory=dict)
    """(scope, name) → where it is read, for deciding whether a binding may go from the graded source."""
    parents: dict[str, str] = field(default_factory=dict)
    """Function scope → the scope it is defined in ("" the module)."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Module-level names bound by import to pytest, math or pytest's `raises`, `warns`, `mark`, `param`:
    local name → what it is (`pt` → `pytest`). A check is recognised only through these."""
    watched: set[Position] = field(default_factory=set)
    """Reads of a name that cannot change its value unseen: a check's operand that is the name itself, the
    receiver of an in-place change (traced as part of the name's value). Any other read (`collect(errors)`,
    `add = errors.append`) lets the value change where nothing traces it."""
    messages: dict[str, Position] = field(default_factory=dict)
    """Site id → the span of its failure message (an assert's `, msg`, unittest's `msg`): gone with the check."""
    unsupported: list[tuple[int, str]] = field(default_factory=list)
    """Checks that are not rewritten (line, why): they still raise inside the process."""


def conjuncts(test: ast.expr) -> list[ast.expr]:
    """`assert a and b` checks a, then b."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for value in test.values for part in conjuncts(value)]
    return [test]


def strip_not(test: ast.expr) -> tuple[ast.expr, bool]:
    negate = False
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negate = test.operand, not negate
    return test, negate


def is_name(node: ast.AST, *dotted: str, aliases: dict[str, str] | None = None) -> bool:
    """`node` spells `a.b.c` for one of `dotted`; with `aliases`, its first name must be one of them (an
    import of pytest or math), read through it."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return False
    first = node.id if aliases is None else aliases.get(node.id)
    return first is not None and ".".join([first, *reversed(parts)]) in dotted


def pytest_check(call: ast.AST, aliases: dict[str, str]) -> str | None:
    """`raises` / `warns` when `call` is pytest's (or unittest's, on self), else None."""
    if not isinstance(call, ast.Call):
        return None
    if is_name(call.func, "pytest.raises", "raises", aliases=aliases):
        return "raises"
    if is_name(call.func, "pytest.warns", "warns", aliases=aliases):
        return "warns"
    if isinstance(call.func, ast.Attribute) and is_name(call.func.value, "self") and call.func.attr in RAISES_UNITTEST:
        return RAISES_UNITTEST[call.func.attr][0]
    return None


def call_regex(call: ast.Call) -> int:
    """1 when `call` is an assert*Regex method (its second argument is the pattern), else 0."""
    return int(isinstance(call.func, ast.Attribute) and RAISES_UNITTEST.get(call.func.attr, ("", False))[1])


def unittest_method(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_name(node.func.value, "self") \
            and node.func.attr in UNITTEST:
        return node.func.attr
    return None


def parametrize_args(call: ast.AST, aliases: dict[str, str]) -> tuple[list[str], ast.expr] | None:
    """(argnames, argvalues) of `pytest.mark.parametrize(...)`, when argnames are written literally."""
    if not (isinstance(call, ast.Call) and is_name(call.func, "pytest.mark.parametrize", "mark.parametrize",
                                                   aliases=aliases)):
        return None
    args = list(call.args)
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    names = args[0] if args else kw.get("argnames")
    values = args[1] if len(args) > 1 else kw.get("argvalues")
    if names is None or values is None:
        return None
    if isinstance(names, ast.Constant) and isinstance(names.value, str):
        argnames = [n.strip() for n in names.value.split(",") if n.strip()]
    elif isinstance(names, ast.Tuple | ast.List) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                         for e in names.elts):
        argnames = [str(e.value) for e in names.elts if isinstance(e, ast.Constant)]  # type: ignore[union-attr]
    else:
        return None
    return argnames, values


def row_cells(row: ast.expr, width: int, aliases: dict[str, str]) -> list[ast.expr] | None:
    """The cells of one parametrize row (`width` argument names), or None when it is not a literal row."""
    if isinstance(row, ast.Call) and is_name(row.func, "pytest.param", "param", aliases=aliases):
        if any(isinstance(arg, ast.Starred) for arg in row.args) or len(row.args) != width:
            return None
        return list(row.args)
    if width == 1:
        return [row]
    if isinstance(row, ast.Tuple | ast.List) and len(row.elts) == width \
            and not any(isinstance(e, ast.Starred) for e in row.elts):
        return list(row.elts)
    return None


def literal_rows(node: ast.expr) -> list[ast.expr] | None:
    if isinstance(node, ast.List | ast.Tuple) and not any(isinstance(e, ast.Starred) for e in node.elts):
        return list(node.elts)
    return None


class _Analyser:
    def __init__(self, module: Module) -> None:
        self.m = module
        self.count = 0
        self.changes: list[tuple[str, str, str]] = []
        """(scope, name, leaf) of each in-place change: part of the value of the name that scope sees."""

    def _id(self, role: str, node: ast.AST) -> str:
        key = (role, position(node))
        if key not in self.m.ids:
            self.count += 1
            self.m.ids[key] = f"{self.m.prefix}{role[0]}{self.count}"
        return self.m.ids[key]

    def bind(self, scope: str, name: str, binding: Binding) -> None:
        self.m.bindings.setdefault((scope, name), []).append(binding)

    def leaf(self, scope: str, node: ast.expr) -> str:
        lid = self._id("leaf", node)
        if lid not in self.m.leaves:  # an in-place change registered it first, with the names it reads
            self.m.leaves[lid] = Leaf(lid, scope, free_names(node), node.id if isinstance(node, ast.Name) else None,
                                      is_pure(node), is_pure(node) and not any(
                                          isinstance(n, ast.List | ast.Dict | ast.Set) for n in ast.walk(node)))
        return lid

    def bind_targets(self, scope: str, target: ast.expr, binding: Binding) -> None:
        if isinstance(target, ast.Name):
            self.bind(scope, target.id, binding)
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self.bind_targets(scope, element, binding)
        elif isinstance(target, ast.Starred):
            self.bind_targets(scope, target.value, binding)

    # -- scopes --------------------------------------------------------------------------------------------
    def module(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            if isinstance(stmt, ast.Import):
                self.m.aliases.update({a.asname or a.name: a.name for a in stmt.names if a.name in ("pytest", "math")})
            elif isinstance(stmt, ast.ImportFrom) and stmt.module == "pytest" and not stmt.level:
                self.m.aliases.update({a.asname or a.name: a.name for a in stmt.names
                                       if a.name in ("raises", "warns", "mark", "param")})
        for stmt in tree.body:  # tables read by name: their rows are leaves of their own
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                rows = literal_rows(stmt.value)
                if rows is not None:
                    self.m.table_rows[stmt.targets[0].id] = rows
        self.statements("", tree.body, top=True)
        for scope, name, lid in self.changes:
            where = resolve(self.m, scope, name)
            if where is not None:
                self.bind(where, name, Binding("value", (lid,)))
        self.reads(tree)

    def statements(self, scope: str, body: list[ast.stmt], *, top: bool = False) -> None:
        for stmt in body:
            self.statement(scope, stmt, top=top)

    def statement(self, scope: str, stmt: ast.stmt, *, top: bool) -> None:
        opaque = Binding("opaque")
        mutation = mutated_name(stmt)
        if mutation is not None and mutation[0] not in self.m.aliases:  # part of how the name's value is built
            self.in_place_change(scope, stmt, mutation, opaque)
        for node in ast.walk(stmt):  # a walrus anywhere binds in this scope
            if isinstance(node, ast.NamedExpr):
                self.bind(scope, node.target.id, opaque)
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self.bind(scope, stmt.name, opaque)
            self.function(stmt, scope)
        elif isinstance(stmt, ast.ClassDef):
            self.bind(scope, stmt.name, opaque)
            for inner in stmt.body:
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    self.statement(scope, inner, top=False)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            self.assignment(scope, stmt, stmt.value, top=top)
        elif isinstance(stmt, ast.AugAssign | ast.AnnAssign):
            self.bind_targets(scope, stmt.target, opaque)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            self.bind_targets(scope, stmt.target, Binding("value", (self.leaf(scope, stmt.iter),)))
            self.statements(scope, stmt.body)
            self.statements(scope, stmt.orelse)
        elif isinstance(stmt, ast.While | ast.If):
            self.statements(scope, stmt.body)
            self.statements(scope, stmt.orelse)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            self.with_block(scope, stmt)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            self.try_block(scope, stmt, opaque)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            self.import_(scope, stmt)
        elif isinstance(stmt, ast.Global | ast.Nonlocal):
            for name in stmt.names:
                self.bind(scope, name, opaque)
        elif isinstance(stmt, ast.Assert) and scope:
            self.assert_statement(scope, stmt)
        elif isinstance(stmt, ast.Expr) and scope:
            if unittest_method(stmt.value):
                self.unittest(scope, stmt.value)  # type: ignore[arg-type]
            else:
                self.calls(scope, stmt.value)
        elif isinstance(stmt, ast.Match):
            self.match_block(scope, stmt, opaque)
        elif isinstance(stmt, ast.Return) and stmt.value is not None and scope:
            self.calls(scope, stmt.value)

    def in_place_change(self, scope: str, stmt: ast.stmt, mutation: tuple[str, ast.expr], opaque: Binding) -> None:
        """Record `stmt`'s in-place change of a named object (`mutation`: the name, the expression it reads) as
        a leaf of that name's value, or the name as opaque when the change's index is computed by calls."""
        name, value = mutation
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
        if isinstance(target, ast.Subscript) and any(isinstance(n, ast.Call) for n in ast.walk(target.slice)):
            self.bind(scope, name, opaque)  # an index computed by calls is outside the traced value
        else:
            receiver = stmt.value.func.value if isinstance(stmt, ast.Expr) else target.value  # type: ignore[attr-defined,union-attr]
            self.m.watched.add(position(receiver))
            lid = self._id("leaf", value)
            reads = free_names(value) | (free_names(target.slice) if isinstance(target, ast.Subscript) else set())
            self.m.leaves[lid] = Leaf(lid, scope, frozenset(reads - {name}))
            self.changes.append((scope, name, lid))  # bound where the name lives, once every scope is known

    def assignment(self, scope: str, stmt: ast.Assign | ast.AnnAssign, value: ast.expr, *, top: bool) -> None:
        """Bind the targets of an assignment of `value`: to the value's leaf, or, for a module-level table read
        by name, to the leaves of its rows and their cells."""
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        table = targets[0].id if top and len(targets) == 1 and isinstance(targets[0], ast.Name) else None
        if table is not None and table in self.m.table_rows:
            cells = [self.leaf("", row) for row in self.m.table_rows[table]]
            for row in self.m.table_rows[table]:
                for cell in row.elts if isinstance(row, ast.Tuple | ast.List) else \
                        row.args if isinstance(row, ast.Call) else []:
                    cells.append(self.leaf("", cell))
            binding = Binding("value", tuple(cells))
        else:
            binding = Binding("value", (self.leaf(scope, value),))
        for target in targets:
            self.bind_targets(scope, target, binding)
        self.calls(scope, value)

    def try_block(self, scope: str, stmt: ast.Try | ast.TryStar, opaque: Binding) -> None:
        """The handlers of a `try` (each one's exception name bound as opaque), then its body, else and finally."""
        for handler in stmt.handlers:
            if handler.name:
                self.bind(scope, handler.name, opaque)
            self.statements(scope, handler.body)
        for part in (stmt.body, stmt.orelse, stmt.finalbody):
            self.statements(scope, part)

    def match_block(self, scope: str, stmt: ast.Match, opaque: Binding) -> None:
        """Each case of a `match`: the names its pattern captures bound as opaque, then its body."""
        for case in stmt.cases:
            for node in ast.walk(case.pattern):
                for captured in (getattr(node, "name", None), getattr(node, "rest", None)):
                    if isinstance(captured, str):
                        self.bind(scope, captured, opaque)
            self.statements(scope, case.body)

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, outer: str) -> None:
        scope = self._id("scope", node)
        self.m.parents[scope] = outer
        columns: dict[str, Binding] = {}
        for decorator in node.decorator_list:
            parsed = parametrize_args(decorator, self.m.aliases)
            if parsed is not None:
                columns.update(self.table(decorator, parsed, scope))
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                    *([arguments.vararg] if arguments.vararg else []), *([arguments.kwarg] if arguments.kwarg else [])]:
            self.bind(scope, arg.arg, columns.get(arg.arg, Binding("opaque")))
        self.statements(scope, node.body)

    def table(self, decorator: ast.expr, parsed: tuple[list[str], ast.expr], scope: str) -> dict[str, Binding]:
        argnames, values = parsed
        tid = self._id("table", decorator)
        source = values.id if isinstance(values, ast.Name) and values.id in self.m.table_rows else ""
        rows = self.m.table_rows[source] if source else literal_rows(values)
        cells: list[list[str]] | None = None
        if rows is not None:
            split = [row_cells(row, len(argnames), self.m.aliases) for row in rows]
            if all(row is not None for row in split):
                cells = [[self.leaf("", cell) for cell in row] for row in split if row is not None]
        self.m.tables[tid] = Table(tid, scope, argnames, cells, source)
        if cells is None:
            return {}
        return {name: Binding("value", tuple(row[i] for row in cells)) for i, name in enumerate(argnames)}

    def import_(self, scope: str, stmt: ast.Import | ast.ImportFrom) -> None:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            return
        oid = self._id("origin", stmt)
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                module = alias.name if alias.asname else alias.name.split(".", 1)[0]
                self.m.imports[f"{oid}.{alias.name}"] = (module, 0)
                self.bind(scope, alias.asname or module, Binding("import", origin=f"{oid}.{alias.name}"))
        else:
            self.m.imports[oid] = (stmt.module or "", stmt.level)
            for alias in stmt.names:
                if alias.name != "*":
                    self.bind(scope, alias.asname or alias.name, Binding("import", origin=oid))

    # -- checks ----------------------------------------------------------------------------------------------
    def assert_statement(self, scope: str, node: ast.Assert) -> None:
        for index, part in enumerate(conjuncts(node.test)):
            sid = f"{self._id('site', node)}.{index}"
            self.m.sites[sid] = self.expression_site(scope, sid, part, node.lineno)
            if node.msg is not None:
                self.m.messages[sid] = position(node.msg)

    def expression_site(self, scope: str, sid: str, part: ast.expr, line: int) -> Site:
        inner, negate = strip_not(part)
        if isinstance(inner, ast.Compare) and judged_by_value(inner):
            operands = [inner.left, *inner.comparators]
            self.m.watched.update(position(o) for o in operands if isinstance(o, ast.Name))
            return Site(sid, self.m.path, line, "compare", tuple(COMPARE_OPS[type(op)] for op in inner.ops),
                        tuple(self.leaf(scope, o) for o in operands), negate)
        if isinstance(inner, ast.Call) and is_name(inner.func, "math.isclose", aliases=self.m.aliases) and len(inner.args) == 2 \
                and not any(isinstance(a, ast.Starred) for a in inner.args) \
                and all(k.arg in ("rel_tol", "abs_tol") for k in inner.keywords):
            leaves = [self.leaf(scope, a) for a in inner.args] + [self.leaf(scope, k.value) for k in inner.keywords]
            return Site(sid, self.m.path, line, "isclose", tuple(str(k.arg) for k in inner.keywords), tuple(leaves),
                        negate)
        self.calls(scope, part)
        return Site(sid, self.m.path, line, "truth")

    def unittest(self, scope: str, call: ast.Call) -> None:
        method = unittest_method(call)
        assert method is not None
        kind, ops, negate, arity = UNITTEST[method]
        extra = UNITTEST_KEYWORDS.get(kind, ())
        keywords = [k for k in call.keywords if k.arg != "msg"]
        most = arity + (2 if kind == "almost" else 1)  # almost: (first, second, places, msg); else a msg after
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg not in extra for k in keywords) \
                or not arity <= len(call.args) <= most:
            self.m.unsupported.append((call.lineno, f"self.{method} with arguments this grader does not read"))
            return
        sid = self._id("site", call)
        args = call.args[:arity]
        message = next((k.value for k in call.keywords if k.arg == "msg"), None)
        if message is None and len(call.args) == most:
            message = call.args[-1]
        if message is not None:
            self.m.messages[sid] = position(message)
        if kind == "compare" and not judged_by_value(ast.Compare(args[0], [_op_node(ops[0])], [args[1]])):
            kind = "truth"
        if kind in ("truth", "instance"):
            self.calls(scope, call)
            self.m.sites[sid] = Site(sid, self.m.path, call.lineno, "truth")
            return
        leaves = [self.leaf(scope, a) for a in args]
        self.m.watched.update(position(a) for a in args if isinstance(a, ast.Name))
        names = tuple(str(k.arg) for k in keywords)
        if kind == "almost":
            places = call.args[arity:arity + 1]  # assertAlmostEqual(first, second, places, msg, delta)
            names = (("places",) if places else ()) + names
            leaves += [self.leaf(scope, p) for p in places] + [self.leaf(scope, k.value) for k in keywords]
        self.m.sites[sid] = Site(sid, self.m.path, call.lineno, kind, ops or names, tuple(leaves), negate, "unittest")

    def with_block(self, scope: str, stmt: ast.With | ast.AsyncWith) -> None:
        for item in stmt.items:
            if item.optional_vars is not None:
                self.bind_targets(scope, item.optional_vars, Binding("opaque"))
        if scope and len(stmt.items) == 1 and pytest_check(stmt.items[0].context_expr, self.m.aliases):
            self.raises(scope, stmt.items[0].context_expr, block=True)  # type: ignore[arg-type]
        else:
            for item in stmt.items:
                self.calls(scope, item.context_expr)
        self.statements(scope, stmt.body)

    def calls(self, scope: str, node: ast.AST) -> None:
        """pytest.raises / assertRaises in their call form, anywhere in an expression."""
        if not scope:
            return
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and pytest_check(call, self.m.aliases) and len(call.args) >= 2 + call_regex(call):
                self.raises(scope, call, block=False)

    def raises(self, scope: str, call: ast.Call, *, block: bool) -> None:
        kind = pytest_check(call, self.m.aliases) or "raises"
        style = "unittest" if isinstance(call.func, ast.Attribute) and is_name(call.func.value, "self") else "pytest"
        regex = style == "unittest" and RAISES_UNITTEST[call.func.attr][1]  # type: ignore[attr-defined]
        keywords = {k.arg: k.value for k in call.keywords}
        expected = call.args[0] if call.args else keywords.get("expected_exception" if kind == "raises"
                                                                 else "expected_warning")
        if expected is None or any(isinstance(a, ast.Starred) for a in call.args[:2]) or None in keywords:
            self.m.unsupported.append((call.lineno, f"a {kind} check this grader does not read"))
            return
        match = (call.args[1] if len(call.args) > 1 else None) if regex else keywords.get("match") if block else None
        if (regex and match is None) or (not block and style == "pytest" and "match" in keywords):
            self.m.unsupported.append((call.lineno, f"a {kind} check this grader does not read"))
            return
        sid = self._id("site", call)
        leaves = [self.leaf(scope, expected)] + ([self.leaf(scope, match)] if match is not None else [])
        self.m.sites[sid] = Site(sid, self.m.path, call.lineno, kind, (), tuple(leaves), False, style)

    # -- reads -------------------------------------------------------------------------------------------------
    def reads(self, tree: ast.Module) -> None:
        for scope, node in _scoped_nodes(tree, self.m):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.m.reads.setdefault((scope, node.id), []).append(position(node))


def _op_node(op: str) -> ast.cmpop:
    return next(cls() for cls, name in COMPARE_OPS.items() if name == op)


def judged_by_value(compare: ast.Compare) -> bool:
    """Identity is judged by value outside only against a singleton (None, True, False, ...)."""
    operands = [compare.left, *compare.comparators]
    for i, op in enumerate(compare.ops):
        if isinstance(op, ast.Is | ast.IsNot) and not any(
                isinstance(o, ast.Constant) and any(o.value is s for s in _SINGLETONS) for o in operands[i:i + 2]):
            return False
    return True


_PURE = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare,
         ast.Name, ast.expr_context, ast.unaryop, ast.operator, ast.boolop, ast.cmpop, ast.Starred)


def is_pure(node: ast.AST) -> bool:
    """Nothing in `node` runs code of its own (no call, attribute, item, comprehension, f-string, lambda)."""
    return all(isinstance(child, _PURE) for child in ast.walk(node))


def free_names(node: ast.AST) -> frozenset[str]:
    """Names `node` reads from its enclosing scope."""
    bound: set[str] = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.comprehension):
            bound |= {n.id for n in ast.walk(inner.target) if isinstance(n, ast.Name)}
        elif isinstance(inner, ast.Lambda):
            bound |= {a.arg for a in ast.walk(inner.args) if isinstance(a, ast.arg)}
    return frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)) - bound


def _scoped_nodes(tree: ast.Module, module: Module) -> list[tuple[str, ast.AST]]:
    """Every node with the scope that reads its names ("" for the module and decorators)."""
    out: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for outer in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
                if outer is not None:
                    visit(outer, scope)
            inner = module.ids.get(("scope", position(node)), scope)
            for stmt in node.body:
                visit(stmt, inner)
            return
        out.append((scope, node))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    for stmt in tree.body:
        visit(stmt, "")
    return out


def resolve(module: Module, scope: str, name: str) -> str | None:
    """The scope whose binding of `name` a read in `scope` sees (enclosing functions, then the module), or
    None: a builtin or unbound."""
    while True:
        if (scope, name) in module.bindings:
            return scope
        if not scope:
            return None
        scope = module.parents.get(scope, "")


def reads_of(module: Module, scope: str, name: str) -> list[Position]:
    """Where the binding of `name` in `scope` is read: in that scope, and in every scope nested in it that
    sees that binding (it does not bind the name itself)."""
    return [pos for (s, n), positions in module.reads.items() if n == name and resolve(module, s, n) == scope
            for pos in positions]


def leaf_spans(module: Module) -> dict[str, Position]:
    return {lid: pos for (role, pos), lid in module.ids.items() if role == "leaf"}


def is_builtin(name: str) -> bool:
    return hasattr(builtins, name)


def analyse(source: str, *, path: str, prefix: str) -> Module:
    """The checks, leaves and bindings of one test file. SyntaxError (and ValueError, RecursionError) when
    it does not parse."""
    module = Module(path=path, prefix=prefix)
    _Analyser(module).module(ast.parse(source, filename=path))
    return module
