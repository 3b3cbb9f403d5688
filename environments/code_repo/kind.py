"""The code_repo environment kind."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from core.renderers import HERMES_CALL
from environments.base import (
    GraderFault,
    Kind,
    OpenImage,
    OpenSandbox,
    Sandbox,
    ToolCall,
    ToolResult,
    ToolStatus,
    Verdict,
)
from environments.code_repo import verifier
from environments.code_repo.repo import export_image_repo, install_repo
from environments.code_repo.task import CodeRepoTask, ImageRepo, RepoSnapshot
from environments.code_repo.tools import TOOL_SCHEMAS, execute_tool
from environments.spec import EnvironmentSpec

MAX_EXPORTS = 8
"""Image repositories kept exported in a worker process (a few MiB each; one per SWE-bench instance)."""
_exports: dict[tuple[str, str, str], RepoSnapshot] = {}
_exports_lock = threading.Lock()

SYSTEM_PROMPT = (
    "You are a software engineer working in a git repository at /workspace. Use the tools to inspect "
    "the code, make the change the task asks for, check it with run_tests, then call submit. "
    f"Call exactly one tool per turn as {HERMES_CALL}."
)


class CodeRepoKind(Kind):
    name = "code_repo"
    default_weights = verifier.DEFAULT_WEIGHTS
    formats = ("crucible", "swebench", "harbor")
    task_images = True

    def __init__(self, spec: EnvironmentSpec) -> None:
        self.spec = spec
        self.tool_names = spec.tools or list(TOOL_SCHEMAS)  # a subset: the spec checks (environments/spec.py)
        self.base: str | None = None

    def tools(self) -> list[dict[str, Any]]:
        return [TOOL_SCHEMAS[name] for name in self.tool_names]

    def system_prompt(self) -> str:
        return self.spec.system_prompt or SYSTEM_PROMPT

    @staticmethod
    def parse_task(payload: dict[str, Any]) -> CodeRepoTask:
        return CodeRepoTask.model_validate(payload)

    @staticmethod
    def prepare(*, task: CodeRepoTask, open_image: OpenImage) -> CodeRepoTask:
        """Before any sandbox of the episode: a task whose repository lives in its own image gets that
        repository's checked export (repo.export_image_repo), made in a sandbox of the image no agent uses
        (`open_image`, which hides nothing) and kept for the next episodes of the same image and commit.
        The episode's own sandboxes hide the directory. TaskRefused when the image is unfit."""
        if not isinstance(task.repo, ImageRepo) or task.image is None:
            return task
        key = (task.image, task.repo.path, task.repo.commit)
        with _exports_lock:
            snapshot = _exports.get(key)
        if snapshot is None:
            with open_image(task.image) as sandbox:
                snapshot = export_image_repo(sandbox, task.repo)
            with _exports_lock:
                _exports[key] = snapshot
                while len(_exports) > MAX_EXPORTS:
                    _exports.pop(next(iter(_exports)))
        return task.with_exported(snapshot)

    def opening(self, *, sandbox: Sandbox, task: CodeRepoTask, instruction: str) -> None:
        """The task's instruction is the first message."""
        return None

    def setup(self, *, sandbox: Sandbox, task: CodeRepoTask) -> None:
        # The base commit id is recorded here, outside the sandbox: grading diffs against it, never
        # against a tag or ref the agent could move.
        self.base = install_repo(sandbox, task)

    def execute(self, *, sandbox: Sandbox, call: ToolCall, task: CodeRepoTask) -> ToolResult:
        if call.name not in self.tool_names:
            message = f"tool: expected one of {', '.join(self.tool_names)}, got {json.dumps(call.name)}"
            return ToolResult(observation=message, output=message, status=ToolStatus.ERROR)
        return execute_tool(sandbox=sandbox, call=call, task=task, timeout_s=self.spec.limits.tool_timeout_s)

    def verify(self, *, sandbox: Sandbox, task: CodeRepoTask, submitted: bool, open_sandbox: OpenSandbox,
               actions: Sequence[ToolCall]) -> Verdict:
        if self.base is None:
            raise GraderFault("verify: expected the base commit recorded by setup, got none")
        return verifier.verify(sandbox=sandbox, task=task, base=self.base, submitted=submitted,
                               open_sandbox=open_sandbox, actions=actions, config=self.spec.verifier)
