"""Environment kinds by short name. Each kind lives in its own module and is imported on first use."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from core.errors import ConfigError

if TYPE_CHECKING:
    from environments.base import EnvironmentKind

KINDS: dict[str, str] = {
    "agent_program": "environments.agent_program.kind:AgentProgramKind",
    "browser": "environments.browser.kind:BrowserKind",
    "chat": "environments.chat.kind:ChatKind",
    "code_repo": "environments.code_repo.kind:CodeRepoKind",
    "openenv": "environments.openenv.kind:OpenEnvKind",
    "read_number": "environments.read_number.kind:ReadNumberKind",
}


def kind_names() -> list[str]:
    return sorted(KINDS)


def kind_tools(name: str) -> list[str]:
    """The tools kind `name` offers (its module's TOOL_SCHEMAS), in order: what a spec's `tools` picks from."""
    module_name, _, _ = KINDS[name].partition(":")
    return list(import_module(module_name).TOOL_SCHEMAS)


def get_kind(name: str) -> type[EnvironmentKind]:
    try:
        module_name, _, attr = KINDS[name].partition(":")
    except KeyError:
        raise ConfigError(f"environment kind: expected one of {', '.join(kind_names())}, got {name!r}") from None
    return getattr(import_module(module_name), attr)  # type: ignore[no-any-return]
