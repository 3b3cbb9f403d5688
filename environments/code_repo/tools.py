"""code_repo tools: their OpenAI function schemas and how each runs in the sandbox."""

from __future__ import annotations

import base64
import dataclasses
import posixpath
import shlex
import time
from typing import Any

from environments.base import Sandbox, ToolCall, ToolResult, ToolStatus
from environments.code_repo.task import CodeRepoTask

WORKSPACE = "/workspace"


def _schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_STR = {"type": "string"}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "bash": _schema("bash", "Run a shell command in the repository (cwd and env persist).",
                    {"command": _STR, "timeout": {"type": "integer", "description": "seconds"}}, ["command"]),
    "read_file": _schema("read_file", "Read a file of the repository.", {"path": _STR}, ["path"]),
    "write_file": _schema("write_file", "Create or overwrite a file.", {"path": _STR, "content": _STR},
                          ["path", "content"]),
    "edit_file": _schema("edit_file", "Replace the one occurrence of old_str in a file with new_str.",
                         {"path": _STR, "old_str": _STR, "new_str": _STR}, ["path", "old_str", "new_str"]),
    "run_tests": _schema("run_tests", "Run the repository's public tests.", {}, []),
    "submit": _schema("submit", "Submit the current state of the repository as the solution.", {}, []),
}


class ToolInputError(ValueError):
    """The call's arguments are wrong; the message goes back to the policy as the observation."""


def _argument(call: ToolCall, name: str) -> str:
    value = call.arguments.get(name)
    if not isinstance(value, str):
        given = "nothing" if value is None else type(value).__name__
        raise ToolInputError(f"{call.name}: expected a string argument {name!r}, got {given}")
    return value


def workspace_path(path: str) -> str:
    """Resolve a path the policy gave against the workspace; refuse paths that leave it."""
    resolved = posixpath.normpath(posixpath.join(WORKSPACE, path))
    if resolved != WORKSPACE and not resolved.startswith(WORKSPACE + "/"):
        raise ToolInputError(f"path: expected a path inside {WORKSPACE}, got {path!r}")
    return resolved


def _from_step(step: Any, *, observation: str | None = None) -> ToolResult:
    text = step.output if hasattr(step, "output") else step.stdout
    status = ToolStatus.of_step(step.status)
    return ToolResult(
        observation=observation if observation is not None else text, output=text, exit_code=step.exit_code,
        status=status, duration_s=step.duration_s, truncated_bytes=step.truncated_bytes,
    )


def execute_tool(*, sandbox: Sandbox, call: ToolCall, task: CodeRepoTask, timeout_s: float) -> ToolResult:
    started = time.monotonic()
    try:
        result = _dispatch(sandbox=sandbox, call=call, task=task, timeout_s=timeout_s)
    except ToolInputError as error:
        return ToolResult(observation=str(error), output=str(error), status=ToolStatus.ERROR,
                          duration_s=time.monotonic() - started)
    if call.name in ("write_file", "edit_file"):  # several sandbox round trips: time them here
        result = dataclasses.replace(result, duration_s=time.monotonic() - started)
    return result


def _dispatch(*, sandbox: Sandbox, call: ToolCall, task: CodeRepoTask, timeout_s: float) -> ToolResult:
    if call.name == "bash":
        timeout = call.arguments.get("timeout")
        limit = min(float(timeout), timeout_s) if isinstance(timeout, int | float) and timeout > 0 else timeout_s
        return _from_step(sandbox.step(_argument(call, "command"), timeout_s=limit))
    if call.name == "read_file":
        path = workspace_path(_argument(call, "path"))
        return _from_step(sandbox.step(f"cat -- {shlex.quote(path)}", timeout_s=timeout_s))
    if call.name == "write_file":
        path = workspace_path(_argument(call, "path"))
        content = _argument(call, "content")
        write_file(sandbox, path, content.encode(), timeout_s=timeout_s)
        return ToolResult(observation=f"wrote {len(content)} characters to {path}", exit_code=0)
    if call.name == "edit_file":
        return _edit(sandbox=sandbox, call=call, timeout_s=timeout_s)
    if call.name == "run_tests":
        if task.public_tests is None:
            return ToolResult(observation="this task has no public tests", status=ToolStatus.ERROR)
        return _from_step(sandbox.step(task.public_tests.agent_command(),
                                       timeout_s=min(task.public_tests.timeout_s, timeout_s)))
    if call.name == "submit":
        return ToolResult(observation="submitted", exit_code=0, ends_episode=True)
    raise ToolInputError(f"tool: expected one of {', '.join(TOOL_SCHEMAS)}, got {call.name!r}")


# Small files travel through the persistent shell (one round trip, ~1 ms); larger ones as a tar
# archive through the engine's API (tens of ms, but no size limit).
SHELL_TRANSFER_MAX = 48 * 1024


def write_file(sandbox: Sandbox, path: str, data: bytes, *, timeout_s: float) -> None:
    if len(data) > SHELL_TRANSFER_MAX:
        sandbox.put_files({path: data})
        return
    encoded = base64.b64encode(data).decode()
    quoted = shlex.quote(path)
    step = sandbox.step(f"mkdir -p -- \"$(dirname -- {quoted})\" && printf %s {encoded} | base64 -d > {quoted}",
                        timeout_s=timeout_s)
    if step.exit_code != 0:
        raise ToolInputError(f"cannot write {path}: {step.output.strip()[-300:]}")


def read_file(sandbox: Sandbox, path: str, *, timeout_s: float) -> bytes:
    quoted = shlex.quote(path)
    step = sandbox.step(f"test -f {quoted} || exit 3; [ $(stat -c %s -- {quoted}) -le {SHELL_TRANSFER_MAX} ] "
                        f"|| exit 4; base64 -w0 -- {quoted}", timeout_s=timeout_s)
    if step.exit_code == 3:
        raise FileNotFoundError(path)
    if step.exit_code == 4 or (step.exit_code == 0 and step.truncated_bytes):
        # Larger than the shell's capture keeps (output_head + output_tail: base64 of a 25 KB file already
        # is not): the middle was cut, so the file comes through the engine's archive API instead.
        return sandbox.get_file(path)
    if step.exit_code != 0:
        raise ToolInputError(f"cannot read {path}: {step.output.strip()[-300:]}")
    return base64.b64decode(step.output.strip())


def _edit(*, sandbox: Sandbox, call: ToolCall, timeout_s: float) -> ToolResult:
    path = workspace_path(_argument(call, "path"))
    old, new = _argument(call, "old_str"), _argument(call, "new_str")
    if not old:
        raise ToolInputError("edit_file: expected a non-empty old_str")
    try:
        text = read_file(sandbox, path, timeout_s=timeout_s).decode("utf-8")
    except FileNotFoundError:
        raise ToolInputError(f"edit_file: no file at {path}") from None
    except UnicodeDecodeError:
        raise ToolInputError(f"edit_file: {path} is not UTF-8 text") from None
    count = text.count(old)
    if count != 1:
        raise ToolInputError(f"edit_file: expected old_str to occur exactly once in {path}, found {count}")
    write_file(sandbox, path, text.replace(old, new, 1).encode(), timeout_s=timeout_s)
    return ToolResult(observation=f"edited {path}", exit_code=0)
