"""What a trusted sandbox computes from a task alone, remembered in the worker's process.

    _collected: TaskMemo[list[str] | None] = TaskMemo()
    ids = _collected.get_or_compute([sandbox.image, task, base, spec], lambda: collect_test_ids(sandbox, spec))

Some grading facts depend only on the task (its repository at the recorded base commit, its test
spec, the files the grader adds) and are computed where nothing of any agent's has run: the reference
solution's key (reference.py) and the test ids a layer collects on the base (verifier.py); the
modules an image's interpreter imports depend on the image alone (verifier.py). Every episode of a
group grades the same task, so each is computed once per task and kept here, in the grader's
process, where no submission can reach it. The key is the canonical text of every input
the caller names (the image, the task, the base commit, the spec), so a change to any is a new entry;
a computation that raises (a fault of the machine) is not remembered.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from environments.code_repo.blinding import canonical

T = TypeVar("T")


class TaskMemo(Generic[T]):
    """A bounded, thread-safe, least-recently-used map from a task's inputs to a computed fact."""

    def __init__(self, *, size: int = 512) -> None:
        self.size = size
        self._entries: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_compute(self, inputs: list[Any], compute: Callable[[], T]) -> T:
        digest = hashlib.sha256(canonical(inputs).encode()).hexdigest()
        with self._lock:
            if digest in self._entries:
                self._entries.move_to_end(digest)
                return self._entries[digest]
        value = compute()  # outside the lock: two threads may compute one entry; both get an equal value
        with self._lock:
            self._entries[digest] = value
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value
