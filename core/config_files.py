"""Validated config files (YAML or JSON) and data: one readable line per problem.

    spec = load_model_file(EnvironmentSpec, Path("env.yaml"), what="spec file")
    config = parse_model(RunConfig, data, source="run 3 config")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from core.errors import ConfigError

Model = TypeVar("Model", bound=BaseModel)


def validation_message(error: ValidationError, *, source: str) -> str:
    """`source: field.path: what is wrong (got value); …`"""
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "value"
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message} (got {item.get('input')!r})")
    return f"{source}: " + "; ".join(parts)


def parse_model(model: type[Model], data: Any, *, source: str) -> Model:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(validation_message(error, source=source)) from None


def load_model_file(model: type[Model], path: Path, *, what: str) -> Model:
    """Read YAML (or JSON, by suffix) and validate it; every problem names the file and the field."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the {what} ({error.strerror})") from None
    is_json = path.suffix == ".json"
    try:
        data = json.loads(text) if is_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        detail = " ".join(str(error).split())
        raise ConfigError(f"{path}: expected valid {'JSON' if is_json else 'YAML'}: {detail}") from None
    return parse_model(model, data, source=str(path))
