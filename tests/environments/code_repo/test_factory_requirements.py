"""What a factory package needs for its tests, read from its metadata as data (factory/requirements.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from environments.code_repo.factory.requirements import check_requirements, declared

PKG_INFO = """Metadata-Version: 2.1
Name: widthlib
Version: 1.0
Requires-Dist: wcwidth>=0.2
Requires-Dist: typing-extensions; python_version < "3.8"
Requires-Dist: sphinx; extra == "docs"
Requires-Dist: hypothesis==6.100.0; extra == "test"
Requires-Dist: colorama; sys_platform == "win32"
Provides-Extra: docs
Provides-Extra: test
"""


def test_pkg_info_gives_the_runtime_and_test_requirements_that_apply_here(tmp_path: Path) -> None:
    (tmp_path / "PKG-INFO").write_text(PKG_INFO)
    assert declared(tmp_path) == ["wcwidth>=0.2", "hypothesis==6.100.0"]


def test_pyproject_gives_them_when_there_is_no_pkg_info(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "w"\ndependencies = ["wcwidth==0.2.13", "pywin32; os_name == \'nt\'"]\n'
        '[project.optional-dependencies]\ntests = ["pytest-timeout>=2"]\ndocs = ["sphinx"]\n'
        'dev = ["black; python_version >= \'3.8\'"]\n')
    assert declared(tmp_path) == ["wcwidth==0.2.13", "pytest-timeout>=2"]


def test_a_package_declaring_nothing_needs_nothing(tmp_path: Path) -> None:
    assert declared(tmp_path) == []
    (tmp_path / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: plain\nVersion: 1\n")
    assert declared(tmp_path) == []


@pytest.mark.parametrize("value, message", [
    ("evil @ http://127.0.0.1:8080/evil.whl", "got one with a URL"),
    ("evil @ file:///etc/passwd", "got one with a URL"),
    ("--index-url=http://127.0.0.1/simple", "expected a requirement such as"),
    ("-e .", "expected a requirement such as"),
    ("wcwidth==0.2.13 ; ; ;", "expected a requirement such as"),
    ("", "expected a requirement such as"),
    ("x" * 10_000 + "==1", None),
])
def test_a_requirement_that_is_not_one_from_the_index_is_refused_in_one_line(value: str, message: str | None) -> None:
    if message is None:  # long, but a valid name: pip will say the index has no such project
        assert check_requirements([value], where="--with") == [value]
        return
    with pytest.raises(ConfigError, match=message) as refused:
        check_requirements([value], where="--with")
    assert str(refused.value).startswith("--with: ") and "\n" not in str(refused.value)


def test_a_hostile_metadata_file_is_refused_not_followed(tmp_path: Path) -> None:
    (tmp_path / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: x\nRequires-Dist: evil @ http://127.0.0.1/x.whl\n")
    with pytest.raises(ConfigError, match=r"PKG-INFO: Requires-Dist: expected a requirement from the package index"):
        declared(tmp_path)
    (tmp_path / "PKG-INFO").unlink()
    (tmp_path / "pyproject.toml").write_text("[project]\ndependencies = 'wcwidth'\n")
    with pytest.raises(ConfigError, match=r"project\.dependencies: expected a list of requirement strings"):
        declared(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project\n")
    with pytest.raises(ConfigError, match=r"pyproject\.toml: expected TOML"):
        declared(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\ndependencies = [" + "".join(f'"a{n}",' for n in range(100)) + "]\n")
    with pytest.raises(ConfigError, match="expected at most 64 requirements"):
        declared(tmp_path)
