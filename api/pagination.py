"""Keyset (cursor) pagination: `?cursor=&limit=` in, `{data, next_cursor}` out.

A cursor is the sort key of the last row of a page (e.g. `[id]` or `[name]`), JSON in url-safe
base64. It is opaque to clients and stable under inserts: a page never repeats or skips a row.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Query

from api.errors import ApiError

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_BIGINT = 2**63 - 1
MAX_INT = 2**31 - 1
MAX_KEY_CHARS = 256

Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Rows per page.")]
Cursor = Annotated[str | None, Query(max_length=512, description="`next_cursor` of the previous page.")]

T = TypeVar("T")


def encode_cursor(key: Sequence[Any]) -> str:
    raw = json.dumps(list(key), separators=(",", ":"), default=str).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, *, types: Sequence[type]) -> list[Any] | None:
    """The key in `cursor`, checked against `types` (one per key part); None when there is no cursor."""
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        key = None
    if not isinstance(key, list) or len(key) != len(types) or not all(_fits(v, t) for v, t in zip(key, types, strict=True)):
        raise ApiError(422, "invalid_cursor",
                       f"cursor: expected the next_cursor of a previous page of this list, got {cursor[:40]!r}")
    return key


def _fits(value: Any, kind: type) -> bool:
    if kind is str:  # a forged key must not reach Postgres as a NUL or a lone surrogate
        return isinstance(value, str) and len(value) <= MAX_KEY_CHARS and "\x00" not in value and _encodes(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and -MAX_BIGINT <= value <= MAX_BIGINT
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def page(rows: Sequence[T], *, limit: int, key: Any) -> tuple[list[T], str | None]:
    """Rows fetched with `limit + 1` → (the page, the cursor after it or None on the last page)."""
    if len(rows) <= limit:
        return list(rows), None
    kept = list(rows[:limit])
    return kept, encode_cursor(key(kept[-1]))
