"""Per-step aggregates of trained-on steps never change: keep them, compute only the steps after.

The trainer consumes a step's groups together; a consumed group never changes, nor do its episodes.
So the points of every step below a run's latest consumed step are final (the latest one is
recomputed each time, in case the trainer is still writing it). A live run page that polls every few
seconds then reads only the newest step's episodes. Entries are keyed by (run id, run creation time) —
a recreated database never serves another run's points — and only the most recent runs are kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime
from typing import Any

Points = dict[int, dict[str, Any]]
CacheKey = tuple[int, datetime]


class StepPointCache:
    def __init__(self, *, max_runs: int = 64) -> None:
        self._max_runs = max_runs
        self._entries: OrderedDict[CacheKey, tuple[int, Points]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: CacheKey) -> tuple[int, Points] | None:
        """(the last final step, its points and those before it), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: CacheKey, *, final_step: int, points: Points) -> None:
        with self._lock:
            self._entries[key] = (final_step, {x: point for x, point in points.items() if x <= final_step})
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_runs:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


STEP_POINTS = StepPointCache()
