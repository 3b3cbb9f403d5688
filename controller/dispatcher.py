"""Where episode tasks are sent: a `Dispatcher` is anything with Celery's `send_task`.

    dispatcher = celery_dispatcher()          # the Celery app: real broker
    dispatcher = RecordingDispatcher()        # in memory: tests, dry runs

The controller never imports task code: it sends the task by name, one message per episode, to the
queue named after the environment kind.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

EPISODE_TASK = "crucible.run_episode"


class Dispatcher(Protocol):
    def send_task(self, name: str, args: Sequence[Any] | None = None, **options: Any) -> Any: ...


def send_episode(dispatcher: Dispatcher, *, episode_id: int, queue: str) -> None:
    dispatcher.send_task(EPISODE_TASK, args=[episode_id], queue=queue)


def celery_dispatcher() -> Dispatcher:
    """The process's Celery app (built on first use from settings)."""
    from task_workers.celery_app import get_app

    return get_app()


@dataclass(frozen=True)
class SentTask:
    name: str
    args: tuple[Any, ...]
    queue: str | None


@dataclass
class RecordingDispatcher:
    """Keeps what would have been sent. `fail` makes every send raise (a broker outage)."""

    sent: list[SentTask] = field(default_factory=list)
    fail: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def send_task(self, name: str, args: Sequence[Any] | None = None, **options: Any) -> None:
        if self.fail:
            raise ConnectionError("broker unavailable (RecordingDispatcher.fail is set)")
        with self._lock:
            self.sent.append(SentTask(name, tuple(args or ()), options.get("queue")))

    @property
    def episode_ids(self) -> list[int]:
        return [int(task.args[0]) for task in self.sent if task.name == EPISODE_TASK]
