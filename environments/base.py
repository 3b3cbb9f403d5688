"""The interface every environment kind implements, and the values that cross it.

An episode runner drives a kind like this (task_workers/episode/runner.py, and the OpenEnv server):

    kind = get_kind(spec.kind)(spec)
    task = kind.parse_task(stored_task.payload)                   # the task's payload, validated
    kind.setup(sandbox=sb, task=task)                             # put the repo / site in place
    opening = kind.opening(sandbox=sb, task=task, instruction=text)  # the first message, or None
    result = kind.execute(sandbox=sb, call=tool_call, task=task)  # one tool call → observation
    verdict = kind.verify(sandbox=sb, task=task, submitted=True, open_sandbox=pool.open_fresh,
                          actions=[call, ...])                    # layers and flags
    reward = total(verdict.layers, verdict.flags, spec)           # environments.rewards: the reward
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from environments.spec import EnvironmentSpec
from sandboxes.backend import ExecResult
from sandboxes.browser import BrowserSession
from sandboxes.openenv import OpenEnvSession
from sandboxes.shell import StepResult
from sandboxes.stream import ExecStream


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class Artifact:
    """A file an observation produced besides its text (a screenshot), stored with its turn."""

    name: str
    """What it is: `screenshot`, …"""
    media_type: str
    """`image/png`, …"""
    data: bytes


@dataclass(frozen=True)
class Opening:
    """The first user message of an episode when the kind builds it from the sandbox (a browser's goal
    and first page) instead of the task's instruction alone."""

    text: str
    artifacts: tuple[Artifact, ...] = ()


class ToolStatus(StrEnum):
    """How a tool call ended: a sandbox step's own status (sandboxes.StepStatus, every value of which is
    one of these), or `error` where the kind refused the call."""

    OK = "ok"
    ERROR = "error"
    """The call was wrong (a tool, argument or value the kind refused); nothing ran."""
    TIMEOUT = "timeout"
    OOM = "oom"
    OUTPUT_TRUNCATED = "output_truncated"
    CONTROL_FAULT = "control_fault"
    SANDBOX_DEAD = "sandbox_dead"

    @classmethod
    def of_step(cls, status: str) -> ToolStatus:
        """A sandbox step's status (a StepStatus, or the string a driver gave) as a tool status."""
        return cls(str(status))


@dataclass(frozen=True)
class ToolResult:
    """What a tool call did. `observation` is what the policy sees; `output` is the full text."""

    observation: str
    output: str = ""
    exit_code: int | None = None
    status: ToolStatus = ToolStatus.OK
    duration_s: float = 0.0
    truncated_bytes: int = 0
    ends_episode: bool = False
    """`submit` ends the episode with reason `submitted` (as does a page that says its task is done)."""
    artifacts: tuple[Artifact, ...] = ()
    """Files this observation produced (a screenshot), stored with the turn."""

    @property
    def is_error(self) -> bool:
        return self.status not in (ToolStatus.OK, ToolStatus.OUTPUT_TRUNCATED)


def tool_error(message: str, *, prefix: str = "Error: ") -> ToolResult:
    """A tool call the kind refused (a wrong tool, argument or value): the agent sees `prefix` + `message`."""
    return ToolResult(observation=f"{prefix}{message}", output=message, status=ToolStatus.ERROR)


@dataclass(frozen=True)
class LayerResult:
    name: str
    score: float
    """In [0, 1]; a page's own reward (MiniWoB++ reports one in [-1, 1]) is kept as the page gave it."""
    passed: bool
    detail: str = ""
    duration_s: float = 0.0
    record: dict[str, Any] | None = None
    """What a layer keeps beyond its one-line detail, stored with the episode (a judge: its prompt,
    whole output, parsed score and latency)."""


@dataclass(frozen=True)
class Verdict:
    """What grading saw: the layers and the hack monitors' flags, never a reward (environments.rewards.total
    derives it from them, with the spec's weights and flag policy)."""

    layers: list[LayerResult] = field(default_factory=list)
    diff: str = ""
    """What the agent changed, exactly as graded."""
    flags: list[str] = field(default_factory=list)
    """What the hack monitors saw (core.flags.EpisodeFlag values), sorted."""

    @property
    def components(self) -> dict[str, float]:
        return {layer.name: layer.score for layer in self.layers}


class GraderFault(RuntimeError):
    """Grading could not be done for a reason of the machine's (no fresh sandbox, the engine gone):
    an infrastructure fault, retried. Whatever the agent caused is a Verdict, never this."""


class TaskRefused(RuntimeError):
    """The task itself is unfit to play (its own image holds the answer): the episode fails at once,
    never retried (a retry would meet the same task) and never trained on."""


class Sandbox(Protocol):
    """The part of a sandbox an environment uses (see sandboxes)."""

    @property
    def image(self) -> str:
        """The image the container runs (what a fact computed in it depends on besides its inputs)."""
        ...

    def step(self, command: str, *, timeout_s: float | None = None) -> StepResult: ...
    def exec(self, argv: list[str], *, timeout_s: float = ..., stdin: bytes | None = None,
             as_keeper: bool = False, as_control: bool = False) -> ExecResult:
        """A one-off process outside the agent's shell; `as_keeper` runs it as a uid the agent is not,
        `as_control` as root with only SETUID, SETGID and KILL (to start a process as the agent)."""
        ...
    def put_files(self, files: dict[str, bytes], *, dest: str = ...) -> None: ...
    def put_archive(self, data: bytes, *, dest: str = ...) -> None: ...
    def get_file(self, path: str) -> bytes: ...
    def browser(self) -> BrowserSession:
        """A browser image's driver session."""
        ...
    def openenv(self, **hello: Any) -> OpenEnvSession:
        """An openenv image's bridge session (started with `hello`: the app, its folder, its environment)."""
        ...
    def open_control(self, argv: list[str]) -> ExecStream:
        """A long-lived process of ours with its stdin/stdout attached (an agent program's bridge), run as
        the control user with a clean environment."""
        ...


OpenSandbox = Callable[[], AbstractContextManager[Sandbox]]


OpenImage = Callable[[str], AbstractContextManager[Sandbox]]


class EnvironmentKind(Protocol):
    """One kind of environment (code_repo, browser, …): a folder of its own under environments/ and one line
    in environments/registry.py. What the platform asks of a kind beyond an episode's steps is here too —
    its spec section, its task formats, an example payload, a default instruction, a `prepare` step —
    so that no module outside the kind's folder branches on its name. `Kind` gives the defaults."""

    name: ClassVar[str]
    """The kind's name in specs (`kind: …`), the registry and the Celery queue its episodes use."""
    default_weights: dict[str, float]
    """Each layer's weight when the spec names none (environments.rewards.layer_weights)."""
    config_model: ClassVar[type[BaseModel] | None]
    """The model of the kind's own spec section, written under the kind's name (`browser: {…}`); None: none."""
    formats: ClassVar[tuple[str, ...]]
    """The task formats an environment of this kind imports (environments.tasks); `crucible` first."""
    example: ClassVar[str | None]
    """A task payload to show in an error, for a kind whose tasks are payload lines (environments.task_lines);
    None: the kind reads task files of its own (code_repo's repositories)."""
    task_images: ClassVar[bool]
    """Whether a task may name an image of its own (the spec's `task_images` then says which)."""

    def __init__(self, spec: EnvironmentSpec) -> None: ...

    @classmethod
    def check_spec(cls, spec: EnvironmentSpec) -> None:
        """The kind's own rules on a whole spec, at registration (raise ValueError saying what was expected)."""
        ...

    @staticmethod
    def parse_task(payload: dict[str, Any]) -> Any:
        """The task a stored payload describes (a pydantic model); raises pydantic's ValidationError."""
        ...

    @staticmethod
    def default_instruction(task: Any) -> str | None:
        """A task line's instruction when it gives none; None: the line must give one."""
        ...

    @staticmethod
    def prepare(*, task: Any, open_image: OpenImage) -> Any:
        """Before any sandbox of the episode: the task as its sandboxes need it (code_repo: the repository a
        task's own image holds, exported in a sandbox of that image, `open_image`)."""
        ...

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI function schemas offered to the policy."""
        ...

    def system_prompt(self) -> str: ...

    def setup(self, *, sandbox: Sandbox, task: Any) -> None:
        """Put the task in place in a fresh (or freshly reset) sandbox."""
        ...

    def opening(self, *, sandbox: Sandbox, task: Any, instruction: str) -> Opening | None:
        """The first user message when the kind builds it from the sandbox after setup (a browser's goal
        and first page); None: the task's instruction is the first message."""
        ...

    def execute(self, *, sandbox: Sandbox, call: ToolCall, task: Any) -> ToolResult: ...

    def verify(self, *, sandbox: Sandbox, task: Any, submitted: bool, open_sandbox: OpenSandbox,
               actions: Sequence[ToolCall]) -> Verdict:
        """Score the episode, layer by layer; `actions` are the tool calls the agent made, in order.
        Raises GraderFault only for faults of the machine."""
        ...



class Kind:
    """The defaults of EnvironmentKind's optional parts, for a kind to inherit: no section of its own, the
    `crucible` task format, no example payload (so no payload lines), no task images, no rules beyond the
    spec's, no default instruction, no `prepare` step."""

    name: ClassVar[str]
    config_model: ClassVar[type[BaseModel] | None] = None
    formats: ClassVar[tuple[str, ...]] = ("crucible",)
    example: ClassVar[str | None] = None
    task_images: ClassVar[bool] = False

    @classmethod
    def check_spec(cls, spec: EnvironmentSpec) -> None:
        return None

    @staticmethod
    def default_instruction(task: Any) -> str | None:
        return None

    @staticmethod
    def prepare(*, task: Any, open_image: OpenImage) -> Any:
        return task
