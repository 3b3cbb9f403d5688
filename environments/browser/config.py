"""The `browser` section of a browser environment's spec (environments.spec: a kind's own section is
named after the kind and validated by its `config_model`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class BrowserSettings(BaseModel):
    """The `browser` section of a browser environment's spec."""

    model_config = ConfigDict(extra="forbid")

    viewport: tuple[Annotated[int, Field(ge=100, le=4096)], Annotated[int, Field(ge=100, le=4096)]] = (800, 600)
    """Width and height of the page in CSS pixels."""
    screenshots: Literal["none", "opening", "every_turn"] = "every_turn"
    """When a screenshot is taken and stored with the turn (the dashboard shows it; the policy sees text)."""
    tree: Literal["crucible", "browsergym"] = "crucible"
    """How the accessibility tree is written: `crucible`, two spaces a level; `browsergym`, as BrowserGym's
    flatten_axtree_to_str writes it (a tab a level, `value='…'` after the name)."""
    reward: Literal["raw", "success"] = "raw"
    """A MiniWoB++ page's reward: `raw`, the page's own in [-1, 1] (partial credit kept, a wrong try costs
    more than giving up); `success`, 1 when that raw reward is > 0 and else 0 (BrowserGym's success)."""
