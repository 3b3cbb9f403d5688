"""What a factory package needs installed to run its tests: the dependencies it declares, read as data.

    requirements = declared(tree)          # ["wcwidth>=0.2", "pytest-timeout"] from PKG-INFO / pyproject
    checked = check_requirements(["six==1.16.0"], where="--with")

Read from the sdist's PKG-INFO (`Requires-Dist`) or, for a tree without one, pyproject.toml's
`[project]` table: the runtime dependencies, plus those of a `test`, `tests` or `testing` extra, each
marker evaluated for this interpreter. Nothing of the package runs to find them (no setup.py, no build
backend). A requirement that names a URL (`name @ https://…`) is refused: pip would fetch it from
wherever it points, and the factory installs only from the configured package indexes.
"""

from __future__ import annotations

import email.parser
import tomllib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from core.errors import ConfigError

TEST_EXTRAS = ("test", "tests", "testing")
MAX_REQUIREMENTS = 64
MAX_METADATA_BYTES = 1 * 2**20


def check_requirements(values: list[str], *, where: str) -> list[str]:
    """Each a PEP 508 requirement from an index (no URL, no option), normalised; ConfigError names the first
    that is not."""
    if len(values) > MAX_REQUIREMENTS:
        raise ConfigError(f"{where}: expected at most {MAX_REQUIREMENTS} requirements, got {len(values)}")
    out = []
    for value in values:
        try:
            requirement = Requirement(value)
        except InvalidRequirement as error:
            raise ConfigError(f"{where}: expected a requirement such as 'wcwidth==0.2.13', got {value[:200]!r} "
                              f"({_first_line(error)})") from None
        if requirement.url:
            raise ConfigError(f"{where}: expected a requirement from the package index, got one with a URL "
                              f"({value[:200]!r})")
        requirement.marker = None  # evaluated by the caller; pip gets the plain requirement
        out.append(str(requirement))
    return out


def declared(tree: Path) -> list[str]:
    """The requirements the package in `tree` declares for running its tests (see the module's doc)."""
    pkg_info, pyproject = tree / "PKG-INFO", tree / "pyproject.toml"
    if pkg_info.is_file():
        raw = _read(pkg_info, "PKG-INFO")
        values = email.parser.Parser().parsestr(raw, headersonly=True).get_all("Requires-Dist") or []
        if values or not pyproject.is_file():
            return _applicable(values, where=f"{tree.name}/PKG-INFO: Requires-Dist")
    if pyproject.is_file():
        try:
            project = tomllib.loads(_read(pyproject, "pyproject.toml")).get("project", {})
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"pyproject.toml: expected TOML, got {str(error)[:200]}") from None
        if not isinstance(project, dict):
            raise ConfigError("pyproject.toml: [project]: expected a table, got something else")
        values = list(_strings(project.get("dependencies", []), "project.dependencies"))
        extras = project.get("optional-dependencies", {})
        if not isinstance(extras, dict):
            raise ConfigError("pyproject.toml: project.optional-dependencies: expected a table, got something else")
        for extra in TEST_EXTRAS:
            values += [f"{value}; extra == '{extra}'" if ";" not in value else f"{value} and extra == '{extra}'"
                       for value in _strings(extras.get(extra, []), f"project.optional-dependencies.{extra}")]
        return _applicable(values, where=f"{tree.name}/pyproject.toml")
    return []


def _read(path: Path, name: str) -> str:
    if path.stat().st_size > MAX_METADATA_BYTES:
        raise ConfigError(f"{name}: expected at most {MAX_METADATA_BYTES} bytes of metadata, got {path.stat().st_size}")
    return path.read_text(encoding="utf-8", errors="replace")


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"pyproject.toml: {where}: expected a list of requirement strings, got {str(value)[:120]!r}")
    return value


def _applicable(values: list[str], *, where: str) -> list[str]:
    """The requirements whose marker holds here, for the package itself or one of its test extras."""
    kept = []
    for value in values:
        try:
            requirement = Requirement(value)
        except InvalidRequirement as error:
            raise ConfigError(f"{where}: expected PEP 508 requirements, got {value[:200]!r} ({_first_line(error)})") from None
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *TEST_EXTRAS)):
            kept.append(value.split(";", 1)[0].strip())
    return check_requirements(list(dict.fromkeys(kept)), where=where)


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [""])[0][:160]
