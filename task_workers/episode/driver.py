"""One episode's life around its steps, for every caller that plays one: the Celery runner (runner.py,
which calibration uses too), whose agent loop takes the steps, and the OpenEnv server
(task_workers/openenv_server.py), whose client does.

    driver = EpisodeDriver(kind, spec=spec, sandboxes=sandboxes, run_id=run_id, episode_id=episode_id)
    with driver.open(payload, instruction=text) as opened:      # prepare → lease → set up → opening
        result = driver.step(call)                               # one tool call in the agent's sandbox
        verdict = driver.verdict(submitted=True, actions=[call]) # layers and flags, graded in fresh sandboxes

A fault of the machine is SandboxFault (retried); a task unfit to play is TaskRefusedFault (never
retried); what the agent caused is a ToolResult or a Verdict, never an exception.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import ConfigError, CrucibleError
from environments.base import (
    Artifact,
    EnvironmentKind,
    GraderFault,
    Sandbox,
    TaskRefused,
    ToolCall,
    ToolResult,
    Verdict,
)
from environments.spec import EnvironmentSpec
from task_workers.episode.errors import SandboxFault, TaskRefusedFault


class SandboxProvider(Protocol):
    """Where episodes get sandboxes: a leased one for the agent, a fresh one for grading."""

    def lease(self, *, spec: EnvironmentSpec, run_id: int | None,
              episode_id: int | None) -> AbstractContextManager[Any]: ...

    def fresh(self, *, spec: EnvironmentSpec, run_id: int | None,
              episode_id: int | None) -> AbstractContextManager[Sandbox]: ...


@dataclass
class Opened:
    """An episode set up in its sandbox: the task as prepared, the first message, and how long it took."""

    task: Any
    sandbox: Sandbox
    text: str
    """The first user message: the kind's opening (a browser's goal and page), else the task's instruction."""
    artifacts: tuple[Artifact, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    """`lease` and `setup` seconds."""


def prepare_task(kind: EnvironmentKind, task: Any, *, spec: EnvironmentSpec, sandboxes: SandboxProvider,
                 run_id: int | None, episode_id: int | None) -> tuple[Any, EnvironmentSpec]:
    """The task as its episode's sandboxes need it, and the spec they run under (EnvironmentSpec.for_task).
    The kind's `prepare` step (code_repo: export the repository a task's own image holds) runs in sandboxes
    of an image that hide nothing and that no agent uses. ConfigError when the environment does not allow
    the image the task names: checked first, so no sandbox of such an image is made."""
    episode_spec = spec.for_task(task)

    def open_image(image: str) -> AbstractContextManager[Sandbox]:
        return sandboxes.fresh(spec=spec.on_image(image), run_id=run_id, episode_id=episode_id)

    return kind.prepare(task=task, open_image=open_image), episode_spec


class EpisodeDriver:
    """An episode of `kind` under `spec`: opened in a leased sandbox, stepped, graded, the sandbox given back."""

    def __init__(self, kind: EnvironmentKind, *, spec: EnvironmentSpec, sandboxes: SandboxProvider,
                 run_id: int | None, episode_id: int | None) -> None:
        self.kind, self.spec, self.sandboxes = kind, spec, sandboxes
        self.run_id, self.episode_id = run_id, episode_id
        self.opened: Opened | None = None

    @contextmanager
    def open(self, payload: dict[str, Any], *, instruction: str) -> Iterator[Opened]:
        """Prepare the task (a task may name its own image: every sandbox of the episode is then of it),
        lease its sandbox, set the task up and build the first message; the sandbox goes back on exit."""
        started = time.monotonic()
        task = self.kind.parse_task(payload)
        try:
            task, self.spec = prepare_task(self.kind, task, spec=self.spec, sandboxes=self.sandboxes,
                                           run_id=self.run_id, episode_id=self.episode_id)
        except (TaskRefused, ConfigError) as error:
            raise TaskRefusedFault(f"task refused: {error}") from error
        except (RuntimeError, CrucibleError) as error:
            raise SandboxFault(f"task preparation failed: {error}") from error
        with ExitStack() as stack:
            try:
                sandbox = stack.enter_context(self.sandboxes.lease(spec=self.spec, run_id=self.run_id,
                                                                   episode_id=self.episode_id))
            except CrucibleError as error:
                raise SandboxFault(f"no sandbox: {error}") from error
            leased = time.monotonic()
            try:
                self.kind.setup(sandbox=sandbox, task=task)
            except TaskRefused as error:
                raise TaskRefusedFault(f"task refused: {error}") from error
            except (RuntimeError, CrucibleError) as error:
                raise SandboxFault(f"task setup failed: {error}") from error
            set_up = time.monotonic()
            try:  # a browser's first message comes from its sandbox (the goal and the first page)
                opening = self.kind.opening(sandbox=sandbox, task=task, instruction=instruction)
            except (RuntimeError, CrucibleError) as error:
                raise SandboxFault(f"the first observation failed: {error}") from error
            self.opened = Opened(task=task, sandbox=sandbox, text=instruction if opening is None else opening.text,
                                 artifacts=() if opening is None else opening.artifacts,
                                 timings={"lease": leased - started, "setup": set_up - leased})
            try:
                yield self.opened
            finally:
                self.opened = None

    def step(self, call: ToolCall) -> ToolResult:
        """One tool call in the episode's sandbox (the kind refuses a wrong call as a ToolResult)."""
        assert self.opened is not None, "step: the episode is not open"
        return self.kind.execute(sandbox=self.opened.sandbox, call=call, task=self.opened.task)

    def verdict(self, *, submitted: bool, actions: Sequence[ToolCall]) -> Verdict:
        """The kind's verdict on the episode, graded in fresh sandboxes of the episode's spec. Only the
        machine's faults (GraderFault, a sandbox layer error) are SandboxFault, retried, never trained on."""
        assert self.opened is not None, "verdict: the episode is not open"
        spec = self.spec

        def open_fresh() -> AbstractContextManager[Sandbox]:
            return self.sandboxes.fresh(spec=spec, run_id=self.run_id, episode_id=self.episode_id)

        try:
            return self.kind.verify(sandbox=self.opened.sandbox, task=self.opened.task, submitted=submitted,
                                    open_sandbox=open_fresh, actions=list(actions))
        except (GraderFault, CrucibleError) as error:
            raise SandboxFault(f"verification failed: {error}") from error
