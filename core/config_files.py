"""Validated config files (YAML or JSON) and data: one readable line per problem.

    spec = load_model_file(EnvironmentSpec, Path("env.yaml"), what="spec file")
    config = parse_model(RunConfig, data, source="run 3 config")
    data = load_data_text(text, source="env.yaml", json_only=False)   # limits applied, no model

Every document is bounded before it is built: at most MAX_DOCUMENT_BYTES, nested at most MAX_DEPTH
deep, no YAML anchors or aliases (a "billion laughs" file expands a few hundred bytes into gigabytes
once anything walks it), and every string encodable as UTF-8 (a JSON `"\\ud800"` escape is a lone
surrogate Postgres and every encoder refuse). The API applies the same `check_data` to request bodies.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from core.errors import ConfigError

Model = TypeVar("Model", bound=BaseModel)

MAX_DOCUMENT_BYTES = 4 * 2**20
"""A spec or run config file larger than this is refused before it is parsed."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists; real specs nest four or five levels."""
MAX_STRING_CHARS = 1 * 2**20
"""Longest single string in a document (a system prompt, a test file)."""

_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


class DataLimitError(ConfigError):
    """A document breaks a limit (depth, size, aliases, encoding): refused before anything uses it."""


def validation_message(error: ValidationError, *, source: str) -> str:
    """`source: field.path: what is wrong (got value); …`"""
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "value"
        message = item["msg"].removeprefix("Value error, ")
        if " got " in message:  # the validator already said what it was given
            parts.append(f"{where}: {message}")
            continue
        given = repr(item.get("input"))
        parts.append(f"{where}: {message} (got {given if len(given) <= 80 else given[:79] + '…'})")
    return f"{source}: " + "; ".join(parts)


def parse_model(model: type[Model], data: Any, *, source: str) -> Model:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(validation_message(error, source=source)) from None


def decode_text(raw: bytes, *, source: str) -> str:
    """UTF-8 (a byte-order mark may say UTF-16 or UTF-32 instead); anything else is one clear line."""
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as error:
        raise DataLimitError(f"{source}: expected UTF-8 text, got a byte that is not ({error.reason} at byte "
                             f"{error.start})") from None


def check_data(value: Any, *, source: str, max_depth: int = MAX_DEPTH, max_string: int = MAX_STRING_CHARS) -> None:
    """Refuse nesting deeper than `max_depth`, strings longer than `max_string` and lone surrogates.

    Iterative, so a document nested deeper than Python's recursion limit is measured, not crashed on.
    """
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            _check_string(item, source=source, where=where, max_string=max_string)
            continue
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > max_depth:
            raise DataLimitError(f"{source}: expected nesting at most {max_depth} deep, got deeper at {where or 'top'}")
        if isinstance(item, dict):
            for key, child in item.items():
                path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str):
                    _check_string(key, source=source, where=path, max_string=max_string)
                stack.append((child, depth + 1, path))
        else:
            stack.extend((child, depth + 1, f"{where}[{index}]") for index, child in enumerate(item))


def _check_string(text: str, *, source: str, where: str, max_string: int) -> None:
    if len(text) > max_string:
        raise DataLimitError(f"{source}: {where or 'value'}: expected a string of at most {max_string} characters, "
                             f"got {len(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DataLimitError(f"{source}: {where or 'value'}: expected text, got a lone UTF-16 surrogate "
                             f"{text[error.start]!r} at character {error.start}") from None


class _LimitedSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors/aliases and with a depth bound on the node graph."""

    max_depth = MAX_DEPTH

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        peek: Callable[[], Any] = self.peek_event  # untyped in PyYAML's stubs
        if self.check_event(yaml.AliasEvent):
            event = peek()
            raise DataLimitError(f"expected YAML without aliases, got *{event.anchor} at line {event.start_mark.line + 1}")
        event = peek()
        if getattr(event, "anchor", None):
            raise DataLimitError(f"expected YAML without anchors, got &{event.anchor} at line {event.start_mark.line + 1}")
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise DataLimitError(f"expected nesting at most {self.max_depth} deep, got deeper at line "
                                     f"{event.start_mark.line + 1}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_data_text(text: str, *, source: str, json_only: bool = False) -> Any:
    """Parse YAML (a superset of JSON) or strict JSON, with every limit of this module applied."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise DataLimitError(f"{source}: expected at most {MAX_DOCUMENT_BYTES} bytes, got {len(text)}")
    try:
        if json_only:
            data = json.loads(text)
        else:
            loader = _LimitedSafeLoader(text)
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
    except DataLimitError as error:
        raise DataLimitError(f"{source}: {error}") from None
    except RecursionError:
        raise DataLimitError(f"{source}: expected nesting at most {MAX_DEPTH} deep, got far deeper") from None
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        detail = " ".join(str(error).split())
        raise ConfigError(f"{source}: expected valid {'JSON' if json_only else 'YAML'}: {detail}") from None
    check_data(data, source=source)
    return data


def load_model_file(model: type[Model], path: Path, *, what: str) -> Model:
    """Read YAML (or JSON, by suffix) and validate it; every problem names the file and the field."""
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise DataLimitError(f"{path}: expected a {what} of at most {MAX_DOCUMENT_BYTES} bytes, got {size}")
        raw = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the {what} ({error.strerror})") from None
    data = load_data_text(decode_text(raw, source=str(path)), source=str(path), json_only=path.suffix == ".json")
    return parse_model(model, data, source=str(path))
