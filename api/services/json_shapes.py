"""Stored JSON as the API and the dashboard expect it, whatever shape a worker wrote.

JSONB columns (tool calls, verifier layers, reward components, timings, fault records) are written
by workers, verifiers and older versions of both; a page must show a surprising value, not crash
on it. Each function returns the expected container with every key a template reads present, and
keeps a value of another shape visible under `raw`.
"""

from __future__ import annotations

from typing import Any

from core.schemas.episode import FAILURE_KEYS, LAYER_KEYS


def mapping(value: Any) -> dict[str, Any]:
    """A dict with string keys; None → {}, any other shape → {"raw": value}."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(key): item for key, item in value.items()}
    return {"raw": value}


def tool_call(value: Any) -> dict[str, Any] | None:
    if value is None or value == {}:
        return value
    if isinstance(value, dict):
        return mapping(value)
    return {"name": "?", "arguments": value}


def records(value: Any, *, keys: tuple[str, ...], shown_as: str) -> list[dict[str, Any]]:
    """A list of dicts, each with every one of `keys` (the record's fields: core.schemas.episode; None when
    absent); an entry of another shape is kept under `shown_as` (the record's detail or message)."""
    items = value if isinstance(value, list) else ([] if value is None else [value])
    shaped = []
    for item in items:
        entry = mapping(item) if isinstance(item, dict) else {shown_as: item}  # shown where details go
        shaped.append({key: entry.get(key) for key in keys} | entry)
    return shaped


def episode(row: dict[str, Any]) -> dict[str, Any]:
    """An episode summary or detail row with its JSON columns in the shapes the schemas declare."""
    shaped = dict(row)
    for key in ("reward_components", "timings"):
        if key in shaped:
            shaped[key] = mapping(shaped[key])
    if shaped.get("awaiting_judging"):  # the tests' reward alone until the pairwise judge's comes: not final
        shaped["reward"], shaped["reward_components"] = None, {}
    if "verifier_layers" in shaped:
        shaped["verifier_layers"] = records(shaped["verifier_layers"], keys=LAYER_KEYS, shown_as="detail")
    if "failures" in shaped:
        shaped["failures"] = records(shaped["failures"], keys=FAILURE_KEYS, shown_as="message")
    return shaped


def turn(row: dict[str, Any]) -> dict[str, Any]:
    shaped = dict(row)
    shaped["tool_call"] = tool_call(shaped.get("tool_call"))
    return shaped
