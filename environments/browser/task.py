"""Browser tasks: a MiniWoB++ page and seed, or a self-hosted site, its seed, goal and state check.

    {"family": "miniwob", "name": "click-button", "seed": 17}
    {"family": "site", "site": "shop", "site_seed": 4121, "goal": "Buy ...", "check": {...}, "start_path": "/"}

MiniWoB++ tasks are scored by the page's own reward; site tasks by the site's `verify(check, state)`
on the app's state after the episode (what was ordered), never on what the agent says.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from environments.browser.sandbox.sites import NAMES as SITE_NAMES

MINIWOB_NAME = r"^[a-z0-9][a-z0-9-]{0,63}$"


@lru_cache(maxsize=1)
def miniwob_names() -> tuple[str, ...]:
    """Every MiniWoB++ task page of the installed `miniwob` package (the pages the image serves)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        return ()
    pages = Path(next(iter(spec.submodule_search_locations))) / "html" / "miniwob"
    return tuple(sorted(p.stem for p in pages.glob("*.html")))


class BrowserTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    family: Literal["miniwob", "site"]
    name: str | None = Field(default=None, pattern=MINIWOB_NAME)
    """MiniWoB++ task page (`click-button`)."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """MiniWoB++: the page's random seed (Math.seedrandom), so a task id names one problem."""
    site: str | None = Field(default=None, max_length=64)
    site_seed: int = Field(default=0, ge=0, le=2**31 - 1)
    goal: str = Field(default="", max_length=4000)
    """Site tasks: the instruction (MiniWoB++ pages state their own)."""
    check: dict[str, Any] = Field(default_factory=dict, max_length=64)
    """Site tasks: what the site's verify() needs; never shown to the agent."""
    start_path: str = Field(default="/", max_length=512, pattern=r"^/([^/\s][^\s]*)?$")
    navigation: bool = False
    """Whether goto/go_back are allowed (sites: yes; a MiniWoB++ page: no — a reload would draw a new
    problem, an easy one on demand)."""

    @model_validator(mode="after")
    def _family_fields(self) -> BrowserTask:
        if self.family == "miniwob":
            if self.name is None:
                raise ValueError("name: expected a MiniWoB++ task name for family miniwob, got none")
            known = miniwob_names()
            if known and self.name not in known:
                raise ValueError(f"name: expected a MiniWoB++ task of the miniwob package, got {self.name!r}")
            if self.navigation:
                raise ValueError("navigation: expected false for a MiniWoB++ page (a reload draws a new problem)")
        else:
            if self.site not in SITE_NAMES:
                raise ValueError(f"site: expected one of {', '.join(SITE_NAMES)}, got {self.site!r}")
            if not self.goal or not self.check:
                raise ValueError("goal and check: expected both for a site task, got "
                                 f"{'no goal' if not self.goal else 'no check'}")
        return self

    def driver_payload(self) -> dict[str, Any]:
        """What the in-sandbox driver gets: everything but the check (the agent's side never sees it)."""
        return self.model_dump(exclude={"check"})
