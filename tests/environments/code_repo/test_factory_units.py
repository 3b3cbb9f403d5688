"""The task factory's parts that need no sandbox: mutation operators (each one's edit is the bug and
nothing else), hostile sources, and the instruction an agent reads."""

from __future__ import annotations

import ast
import difflib
import io
import tarfile
from pathlib import Path

import pytest

from core.errors import ConfigError
from environments.code_repo.factory.mutations import OPERATORS, mutations
from environments.code_repo.factory.pipeline import _messages, instruction
from environments.code_repo.factory.source import fetch, name_of

SOURCE = '''"""A module with one of everything the operators change."""
import functools


def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:  # below the range
        return lo
    elif x > hi and hi is not None:
        return hi
    return x


@functools.lru_cache(maxsize=None)
def total(items, start=0):
    s = start
    for i in range(len(items) - 1):
        s += items[i] * 2
    label = f"{s + 1} items {'x' if s else 'y'}"
    return max(s, 0), label


def bits(a, b, c):
    return a | b & c, not a or b, a if a in (b, c) else -c


class Box:
    def has(self, key):
        return self.get(key) is not None == True

    def get(self, key):
        def inner(k):
            return k * 3
        return inner(key)
'''


def _changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_every_operator_has_sites_and_each_mutant_is_one_changed_node_in_an_otherwise_identical_file() -> None:
    found = mutations("mod.py", SOURCE)
    assert {m.operator for m in found} == set(OPERATORS)
    original = ast.dump(ast.parse(SOURCE))
    for mutation in found:
        mutated = mutation.apply(SOURCE)
        assert ast.dump(ast.parse(mutated)) != original, mutation
        changed = _changed_lines(SOURCE, mutated)
        removed = [line for line in changed if line.startswith("-")]
        # Only the lines of the mutated node change; everything else (comments, quotes, layout) is the original.
        assert 1 <= len(removed) <= 4, (mutation, changed)
        assert mutated.count("# below the range") == SOURCE.count("# below the range") or mutation.operator == "remove_statement"
        assert mutation.start <= mutation.end and SOURCE[:mutation.start] == mutated[:mutation.start]


def test_a_mutant_means_what_the_operator_says_never_a_precedence_slip() -> None:
    """`a | b & c` with & → | would read as (a | b) | c: the edited text must parse to the tree with that
    one node changed, else the site is not offered."""
    for mutation in mutations("mod.py", SOURCE):
        tree = ast.parse(mutation.apply(SOURCE))
        assert tree is not None
    swapped_ops = [m for m in mutations("mod.py", SOURCE) if m.function == "bits" and m.operator == "change_operator"]
    for mutation in swapped_ops:  # whatever is offered parses as the same shape: a BinOp at the same place
        text = mutation.apply(SOURCE)
        assert "a | b | c" not in text, text
    negations = [m.apply(SOURCE) for m in mutations("mod.py", SOURCE) if m.operator == "negate_condition"]
    assert "    if not x < lo:  # below the range" in "\n".join(negations)
    assert "    elif not (x > hi and hi is not None):" in "\n".join(negations)


def test_nothing_inside_an_f_string_and_no_docstring_is_touched() -> None:
    for mutation in mutations("mod.py", SOURCE):
        mutated = mutation.apply(SOURCE)
        assert 'label = f"{s + 1} items {\'x\' if s else \'y\'}"' in mutated or mutation.operator == "remove_statement"
        assert '"""Clamp x into [lo, hi]."""' in mutated


def test_only_covered_functions_are_mutated_and_a_decorated_function_is_known_by_either_first_line() -> None:
    tree = ast.parse(SOURCE)
    total = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "total")
    decorator_line = total.decorator_list[0].lineno
    by_decorator = mutations("mod.py", SOURCE, covered={decorator_line})
    assert by_decorator and {m.function for m in by_decorator} == {"total"}
    assert {m.function for m in mutations("mod.py", SOURCE, covered={total.lineno})} == {"total"}
    inner = {m.function for m in mutations("mod.py", SOURCE)}
    assert "Box.get.<locals>.inner" in inner and "Box.has" in inner
    assert mutations("mod.py", SOURCE, covered=set()) == []


def test_source_that_does_not_parse_gives_no_mutations() -> None:
    assert mutations("bad.py", "def broken(:\n    pass\n") == []
    assert mutations("nul.py", "x = 1\0\n") == []


def test_at_most_the_per_function_budget_spread_over_operators() -> None:
    body = "\n".join(f"    x{i} = a + {i}" for i in range(40))
    source = f"def long(a):\n{body}\n    return x0\n"
    found = mutations("long.py", source, per_function=6)
    assert len(found) == 6
    assert len({m.operator for m in found}) >= 3


def _sdist(path: Path, members: dict[str, bytes], *, links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


@pytest.mark.parametrize("member", ["../evil.py", "/etc/evil.py", "pkg-1.0/../../evil.py"])
def test_an_sdist_that_leaves_its_folder_is_refused_in_one_line(tmp_path: Path, member: str) -> None:
    archive = _sdist(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/pkg.py": b"x = 1\n", member: b"boom\n"})
    with pytest.raises(ConfigError, match="expected paths inside the repository") as caught:
        fetch(str(archive), into=tmp_path / "work")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "evil.py").exists()


def test_an_sdist_link_that_points_out_is_refused(tmp_path: Path) -> None:
    archive = _sdist(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/pkg.py": b"x = 1\n"},
                     links={"pkg-1.0/secret": "/etc/shadow"})
    with pytest.raises(ConfigError, match="links that stay inside"):
        fetch(str(archive), into=tmp_path / "work")


def test_history_caches_and_docs_never_reach_a_task(tmp_path: Path) -> None:
    project = tmp_path / "lib"
    for path in ("lib/__init__.py", "tests/test_lib.py", ".git/config", "docs/conf.py", "lib/__pycache__/x.pyc",
                 "lib.egg-info/PKG-INFO"):
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text("x = 1\n")
    root = fetch(str(project), into=tmp_path / "work")
    kept = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert kept == ["lib/__init__.py", "tests/test_lib.py"]


@pytest.mark.parametrize("source", ["pypi:toolz", "pypi:../x==1", "pypi:toolz==1.0 --index-url=http://evil",
                                    "git:--upload-pack=touch /tmp/x", "git:repo@--orphan", "/no/such/dir", "file.whl"])
def test_a_source_it_cannot_use_is_one_line_naming_what_was_expected(tmp_path: Path, source: str) -> None:
    with pytest.raises(ConfigError, match="expected") as caught:
        fetch(source, into=tmp_path / "work")
    assert "\n" not in str(caught.value)
    assert not Path("/tmp/x").exists() or source != "git:--upload-pack=touch /tmp/x"


def test_names_for_reports() -> None:
    assert name_of("pypi:toolz==1.0.0") == "toolz-1.0.0"
    assert name_of("/src/my lib/") == "my-lib"
    assert name_of("dist/mylib-1.0.tar.gz") == "mylib-1.0"
    assert name_of("git:../mylib.git@v1") == "mylib-v1"
    assert name_of("git:../mylib.git@v2") == "mylib-v2"  # two revisions never share task ids
    assert name_of("git:git@example.com:team/mylib.git") == "mylib"
    assert name_of("git:ssh://git@example.com/team/mylib") == "mylib"


def test_the_instruction_names_failing_tests_and_errors_never_the_place_or_kind_of_the_bug() -> None:
    log = ("_____ test_clamp_low _____\n    def test_clamp_low():\n>       assert clamp(-1, 0, 5) == 0\n"
           "E       assert -1 == 0\nE        +  where -1 = clamp(-1, 0, 5)\n"
           "=========================== short test summary info ============================\n"
           "FAILED tests/test_lib.py::test_clamp_low - assert -1 == 0\n"
           "FAILED tests/test_lib.py::test_other[a-b] - AssertionError: assert 'some very long text that the sum...\n"
           "FAILED tests/test_lib.py::test_spaced[a b] - ValueError: bad\n")
    messages = _messages(log)
    assert messages["tests/test_lib.py::test_clamp_low"] == "assert -1 == 0"
    assert messages["tests/test_lib.py::test_spaced[a b]"] == "ValueError: bad"
    text = instruction("lib-1.0", ("tests/test_lib.py::test_clamp_low", "tests/test_lib.py::test_other[a-b]"), messages)
    assert "tests/test_lib.py::test_clamp_low: assert -1 == 0" in text
    for leak in ("clamp.py", "flip_comparison", "line", "operator", "mutat"):
        assert leak not in text.lower(), leak
    many = tuple(f"t.py::test_{i}" for i in range(9))
    assert "and 4 more" in instruction("lib", many, {})


def _index(tmp_path: Path, files: dict[str, bytes], *, hashes: dict[str, str] | None = None,
           hrefs: dict[str, str] | None = None) -> dict[str, str]:
    """A PEP 503 index on disk holding `files` for the project `lib`; the pip settings that name only it."""
    import hashlib

    project = tmp_path / "index" / "lib"
    project.mkdir(parents=True)
    (tmp_path / "files").mkdir()
    anchors = []
    for name, data in files.items():
        (tmp_path / "files" / name).write_bytes(data)
        digest = (hashes or {}).get(name, hashlib.sha256(data).hexdigest())
        anchors.append(f'<a href="{(hrefs or {}).get(name, "../../files/" + name)}#sha256={digest}">{name}</a>')
    (project / "index.html").write_text("<html><body>" + "\n".join(anchors) + "</body></html>")
    return {"PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": f"file://{tmp_path / 'index'}", "PIP_EXTRA_INDEX_URL": "",
            "PIP_FIND_LINKS": ""}


def _lib_sdist(tmp_path: Path) -> bytes:
    marker = tmp_path / "setup-ran"
    setup = f"open({str(marker)!r}, 'w').write('ran')\n".encode()
    archive = _sdist(tmp_path / "built.tar.gz", {"lib-1.0/setup.py": setup, "lib-1.0/lib.py": b"def f():\n    return 1\n",
                                                  "lib-1.0/tests/test_lib.py": b"from lib import f\n"})
    return archive.read_bytes()


def test_a_pypi_source_comes_from_the_configured_index_and_none_of_its_code_runs_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in _index(tmp_path, {"lib-1.0.tar.gz": _lib_sdist(tmp_path), "lib-2.0.tar.gz": b"other"}).items():
        monkeypatch.setenv(key, value)
    root = fetch("pypi:lib==1.0", into=tmp_path / "work")
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")) == ["lib.py", "setup.py", "tests/test_lib.py"]
    assert not (tmp_path / "setup-ran").exists()  # pip download would have run setup.py to read its metadata


@pytest.mark.parametrize("trap,expected", [
    ("hash", "does not match the sha256"),
    ("href", "expected a link to a lib-1.0 sdist"),
    ("missing", "found none"),
])
def test_a_lying_or_empty_index_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      trap: str, expected: str) -> None:
    data = _lib_sdist(tmp_path)
    files = {"lib-1.0.tar.gz": data} if trap != "missing" else {"lib-0.9.tar.gz": data}
    settings = _index(tmp_path, files, hashes={"lib-1.0.tar.gz": "0" * 64} if trap == "hash" else None,
                      hrefs={"lib-1.0.tar.gz": "../../files/evil-6.6.tar.gz"} if trap == "href" else None)
    if trap == "href":
        (tmp_path / "files" / "evil-6.6.tar.gz").write_bytes(data)
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=expected) as caught:
        fetch("pypi:lib==1.0", into=tmp_path / "work")
    assert "\n" not in str(caught.value)


def test_crlf_files_keep_their_line_endings_and_a_form_feed_does_not_shift_lines() -> None:
    crlf = "def f(x):\r\n    if x:\r\n        return 1\r\n    return 2\r\n"
    for mutation in mutations("crlf.py", crlf):
        mutated = mutation.apply(crlf)
        assert "\n" not in mutated.replace("\r\n", ""), (mutation.operator, mutated)  # no bare LF a grep could find
    feed = "def f(x):\n    y = x\n\x0c\n    z = y + 1\n    return z\n"
    removed = [m.apply(feed) for m in mutations("feed.py", feed) if m.operator == "remove_statement"]
    assert "def f(x):\n\x0c\n    z = y + 1\n    return z\n" in removed  # `y = x` removed, the line ast named


def test_no_bare_pass_for_an_elif_and_no_plus_zero_tell() -> None:
    source = "def f(x):\n    if x < 0:\n        return -1\n    elif x > 0:\n        return 1\n    return x - 1\n"
    texts = [m.apply(source) for m in mutations("tells.py", source)]
    assert not any("\n    pass\n" in text and "elif" not in text for text in texts)
    assert not any("x - 0" in text or "-0" in text for text in texts)


def test_a_module_too_deep_or_too_long_gives_no_mutations_instead_of_an_error() -> None:
    deep = "def f(a):\n    return " + "+".join(["a"] * 5000) + "\n"
    mutations("deep.py", deep)  # returns (whatever it finds); a RecursionError here ended a whole factory run
    assert mutations("long.py", "x = 1\n" * 100_000) == []


def test_the_index_page_parser_is_linear_in_a_hostile_page() -> None:
    import time

    from environments.code_repo.factory.source import _anchors

    started = time.process_time()
    assert _anchors('<a href="x">' + " " * 2_000_000) == []
    assert time.process_time() - started < 30  # a bound on pathological behaviour (the regex took minutes), not a timing
    assert _anchors('<a data-x="&gt;" href="../f/lib-1.0.tar.gz#sha256=ab">lib&#45;1.0.tar.gz</a>') == [
        ("../f/lib-1.0.tar.gz#sha256=ab", "lib-1.0.tar.gz")]


def test_byte_code_and_patch_leftovers_and_nested_egg_info_never_reach_a_task(tmp_path: Path) -> None:
    project = tmp_path / "lib"
    for path in ("src/lib/__init__.py", "src/lib/__init__.pyc", "src/lib.egg-info/SOURCES.txt", "src/lib/core.py.orig",
                 "src/lib/core.py~", "tests/test_lib.py"):
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text("x = 1\n")
    root = fetch(str(project), into=tmp_path / "work")
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        "src/lib/__init__.py", "tests/test_lib.py"]


def test_an_archive_past_its_bounds_or_naming_a_path_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from environments.code_repo.factory import source

    monkeypatch.setattr(source, "MAX_MEMBERS", 10)
    many = _sdist(tmp_path / "many-1.0.tar.gz", {f"many-1.0/f{i}.py": b"x = 1\n" for i in range(20)})
    with pytest.raises(ConfigError, match="expected at most 10 entries"):
        fetch(str(many), into=tmp_path / "w1")
    import zipfile

    with zipfile.ZipFile(tmp_path / "both-1.0.zip", "w") as zipped:
        zipped.writestr("both-1.0/a", b"file")
        zipped.writestr("both-1.0/a/b.py", b"x = 1\n")
    with pytest.raises(ConfigError, match="as both"):
        fetch(str(tmp_path / "both-1.0.zip"), into=tmp_path / "w2")
    (tmp_path / "broken-1.0.zip").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ConfigError, match="broken"):
        fetch(str(tmp_path / "broken-1.0.zip"), into=tmp_path / "w3")
