"""SandboxSpec: what one sandbox is (image + limits + shell settings). Equal specs share a warm pool.

    spec = SandboxSpec(image="crucible/code-repo:3f2a…", memory="1g", workspace_seed="/opt/seed")
    spec.spec_hash        # stable 16-hex id of the normalised spec; labels every container

The schema itself lives in `core.schemas.sandbox` (pure pydantic, no Docker), so environment specs can
validate their `sandbox` section at registration without importing the sandbox layer. This subclass
only turns a validation failure into SpecError naming the field, what was expected and what was given.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from core.schemas.sandbox import SIZE_FIELDS, describe_errors, format_size, parse_size
from core.schemas.sandbox import SandboxSpec as SandboxSpecSchema
from sandboxes.errors import SpecError

__all__ = ["SIZE_FIELDS", "SandboxSpec", "format_size", "parse_size"]


class SandboxSpec(SandboxSpecSchema):
    """One sandbox's image, resources, isolation and shell settings (frozen, hashable)."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise SpecError(describe_errors(error)) from None
