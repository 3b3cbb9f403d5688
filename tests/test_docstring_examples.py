"""Module docstrings' examples call what exists, as it is called: every call in a Python example of a
module docstring (its indented blocks) is bound against the real signature of what it names, so that an
example that passes an argument the function no longer takes (`timeout_s=` for `timeout=`) fails here.

Running the examples is not possible here (most need a Docker engine, a database or a model); binding
them is what catches a docstring left behind by its code. A name is resolved in the module's own
namespace first, then as the one top-level definition of that name in the packages; a method called on
an instance (`sandbox.step(...)`) as the one method of that name among the classes its module defines.
Calls that resolve to nothing, or to more than one thing, are not checked."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "cli", "controller", "core", "environments", "recipes", "sandboxes", "task_workers", "trainer")


def modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
                  if "sandbox" not in path.relative_to(ROOT).parts[1:-1])  # in-sandbox programs run elsewhere


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def example_blocks(docstring: str) -> Iterator[str]:
    """The docstring's indented blocks that parse as Python (shell lines such as `make demo` do not)."""
    block: list[str] = []
    for line in [*docstring.splitlines(), "end"]:
        if line.startswith("    ") or (block and not line.strip()):  # a blank line inside a block keeps it open
            block.append(line)
            continue
        if block:
            source = textwrap.dedent("\n".join(block)).strip("\n")
            block = []
            try:
                ast.parse(source)
            except SyntaxError:
                continue
            yield source


@cache
def definitions() -> dict[str, list[tuple[str, str]]]:
    """Top-level function and class names → [(module, name)] over the packages."""
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for path in modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append((module_name(path), node.name))
    return found


def resolve(module: Any, call: ast.Call) -> Any:
    """What `call` names, or None where it cannot be told."""
    func = call.func
    if isinstance(func, ast.Name):
        if hasattr(module, func.id):
            return getattr(module, func.id)
        candidates = definitions().get(func.id, [])
        if len(candidates) == 1:
            where, name = candidates[0]
            return getattr(importlib.import_module(where), name, None)
        return None
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and hasattr(module, func.value.id):
            return getattr(getattr(module, func.value.id), func.attr, None)
        if isinstance(func.value, ast.Name):  # an instance: the one method of that name in the module's classes
            methods = [vars(cls)[func.attr] for cls in vars(module).values()
                       if inspect.isclass(cls) and cls.__module__ == module.__name__ and func.attr in vars(cls)]
            if len(methods) == 1 and isinstance(methods[0], staticmethod | classmethod):
                return methods[0].__func__ if isinstance(methods[0], staticmethod) else _Bound(methods[0].__func__)
            if len(methods) == 1 and inspect.isfunction(methods[0]):
                return _Bound(methods[0])
    return None


class _Bound:
    """A method called on an instance: its signature without `self`."""

    def __init__(self, function: Any) -> None:
        parameters = list(inspect.signature(function).parameters.values())[1:]
        self.__signature__ = inspect.Signature(parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> None:  # inspect.signature reads only what is callable
        raise NotImplementedError


def bind_error(target: Any, call: ast.Call) -> str | None:
    """Why `call` cannot bind to `target`'s signature; None when it can (or it cannot be told)."""
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
        return None
    positional = call.args
    if any(isinstance(arg, ast.Constant) and arg.value is Ellipsis for arg in call.args):  # `f(x, ...)`: and the rest
        positional = call.args[:[isinstance(a, ast.Constant) and a.value is Ellipsis for a in call.args].index(True)]
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(len(positional)), **{kw.arg: None for kw in call.keywords if kw.arg})
    except TypeError as error:
        if "missing" in str(error):  # examples may leave arguments out (`...` stands for the rest)
            return None
        return str(error)
    return None


def checked_calls() -> Iterator[tuple[str, int, str, Any, ast.Call]]:
    for path in modules():
        tree = ast.parse(path.read_text())
        docstring = ast.get_docstring(tree, clean=False)
        if not docstring:
            continue
        blocks = list(example_blocks(docstring))
        if not blocks:
            continue
        module = importlib.import_module(module_name(path))
        for source in blocks:
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call):
                    target = resolve(module, node)
                    if target is not None:
                        yield str(path.relative_to(ROOT)), node.lineno, ast.unparse(node)[:120], target, node


def test_every_docstring_example_calls_what_exists_as_it_is_called() -> None:
    wrong, checked = [], 0
    for where, _, text, target, call in checked_calls():
        checked += 1
        error = bind_error(target, call)
        if error is not None:
            wrong.append(f"{where}: {text}: {error}")
    assert checked > 20  # the check reaches the examples it is for
    assert wrong == []


@pytest.mark.parametrize(("source", "wrong"), [
    ('"""\n    sandbox.step("ls", timeout=1)\n"""', True),
    ('"""\n    sandbox.step("ls", timeout_s=1)\n"""', False),
    ('"""\n    create_sandbox(backend=b, spec=s, colour="red")\n"""', True),
])
def test_a_stale_example_is_caught(source: str, wrong: bool) -> None:
    module = importlib.import_module("sandboxes.sandbox")
    docstring = ast.get_docstring(ast.parse(source), clean=False) or ""
    calls = [node for block in example_blocks(docstring) for node in ast.walk(ast.parse(block))
             if isinstance(node, ast.Call)]
    errors = [bind_error(target, call) for call in calls if (target := resolve(module, call)) is not None]
    assert calls and errors and any(errors) is wrong
