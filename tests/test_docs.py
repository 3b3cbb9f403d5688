"""The documentation: the site builds with --strict, the settings page is the settings, the README's
links lead somewhere and the README stays a README."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parent.parent
CELL_NAME = re.compile(r"`([A-Z_]+)`")


def settings_table(text: str) -> dict[str, str]:
    """{CRUCIBLE_NAME: default cell} from the configuration page's table. A row may name several
    settings: `CRUCIBLE_SANDBOX_POOL_MIN` / `_MAX` is ..._POOL_MIN and ..._POOL_MAX (the suffix replaces as
    many trailing words of the first name as it has), with their defaults `1` / `8` in that order."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith(f"`{ENV_PREFIX}"):
            continue
        names = CELL_NAME.findall(cells[0])
        first = names[0]
        full = [first, *("_".join(first.split("_")[:-(len(n.strip("_").split("_")))]) + n for n in names[1:])]
        defaults = [part.strip() for part in cells[1].split(" / ")] if len(full) > 1 else [cells[1]]
        assert len(defaults) == len(full), f"row {cells[0]}: expected {len(full)} defaults, got {cells[1]!r}"
        rows.update(zip(full, defaults, strict=True))
    return rows


def test_a_row_naming_two_settings_is_read_as_two() -> None:
    table = settings_table("| `CRUCIBLE_API_HEAD_TIMEOUT_S` / `_BODY_TIMEOUT_S` | `10` / `120` | time |\n"
                           "| `CRUCIBLE_SANDBOX_POOL_MIN` / `_MAX` | `1` / `8` | pools |\n| `OTHER` | x | y |")
    assert table == {"CRUCIBLE_API_HEAD_TIMEOUT_S": "`10`", "CRUCIBLE_API_BODY_TIMEOUT_S": "`120`",
                     "CRUCIBLE_SANDBOX_POOL_MIN": "`1`", "CRUCIBLE_SANDBOX_POOL_MAX": "`8`"}


def test_the_configuration_page_lists_every_setting_with_its_default() -> None:
    table = settings_table((ROOT / "docs" / "configuration.md").read_text())
    fields = Settings.model_fields
    assert set(table) == {ENV_PREFIX + name.upper() for name in fields}, "docs/configuration.md vs core/settings.py"
    for name, field in fields.items():
        cell = table[ENV_PREFIX + name.upper()]
        default = field.default
        if field.default_factory is not None or default is None:
            continue  # computed at run time (a path under $HOME, the host name) or unset: the cell says how
        if isinstance(default, bool | int | float):
            shown = [float(v) for v in re.findall(r"`(-?[0-9.]+)`", cell)]
            assert shown and shown[0] == float(default), (name, cell, default)
        else:
            assert f"`{default}`" in cell, (name, cell, default)


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    """Strict: a link to a missing page or anchor, or a page left out of the nav, fails the build."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "benchmarks" / "index.html").exists()


@pytest.mark.parametrize("page", ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")))])
def test_every_relative_link_leads_to_a_file(page: str) -> None:
    text = (ROOT / page).read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (ROOT / page).parent / target.split("#", 1)[0]
        assert path.exists(), f"{page}: a link to {target}, which does not exist"


def test_the_readme_stays_short() -> None:
    """The README is the pitch, the two commands and the map; the rest is in docs/ (at most ~12 KB)."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12 * 1024, f"README.md is {size} bytes; expected at most {12 * 1024}: move detail into docs/"
