"""Self-hosted web apps served inside a browser sandbox; each module has `Site(seed)`,
`generate_task(index)` and `verify(check, state)` (see shop.py). Standard library only."""

from __future__ import annotations

from importlib import import_module
from typing import Any

NAMES = ("shop",)


class _Sites(dict):  # type: ignore[type-arg]
    """name -> the site's class, imported on first use (the driver only loads what a task names)."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        if name not in NAMES:
            return default
        return import_module(f".{name}", __name__).Site

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(NAMES)


SITES = _Sites()


def site_module(name: str) -> Any:
    if name not in NAMES:
        raise KeyError(name)
    return import_module(f".{name}", __name__)
