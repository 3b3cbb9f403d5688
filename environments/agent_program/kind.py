"""The agent_program kind: code_repo's tasks, setup and graders; the episode is played by an agent program
inside the sandbox (task_workers/episode/program.py), not by Crucible's tool loop, so it offers no tools."""

from __future__ import annotations

from typing import Any, ClassVar

from environments.agent_program.config import ProgramConfig
from environments.base import Sandbox, ToolCall, ToolResult, tool_error
from environments.code_repo.kind import CodeRepoKind
from environments.spec import EnvironmentSpec

TOOL_SCHEMAS: dict[str, dict[str, Any]] = {}
"""None: the program's own actions run in the sandbox as it decides."""


class AgentProgramKind(CodeRepoKind):
    name = "agent_program"
    config_model: ClassVar[type[ProgramConfig]] = ProgramConfig
    example = None

    def __init__(self, spec: EnvironmentSpec) -> None:
        super().__init__(spec)
        self.tool_names = []
        if not isinstance(spec.kind_config, ProgramConfig):
            raise ValueError("agent_program: expected the spec's `agent_program` section (its command), got none")
        self.program: ProgramConfig = spec.kind_config

    @classmethod
    def check_spec(cls, spec: EnvironmentSpec) -> None:
        if spec.kind_config is None:
            raise ValueError("agent_program: expected a section `agent_program: {command: [...]}` naming the "
                             "program, got none")
        if spec.tools:
            raise ValueError(f"tools: expected none (the program's actions are its own), got {spec.tools}")

    def tools(self) -> list[dict[str, Any]]:
        return []

    def execute(self, *, sandbox: Sandbox, call: ToolCall, task: Any) -> ToolResult:
        return tool_error("an agent_program episode has no tools: the program acts in the sandbox itself")
