"""Crash points for the resume tests: the trainer SIGKILLs itself where the test asks.

    CRUCIBLE_TRAINER_CRASH_AT=pending:2 crucible trainer --run 1   # dies after step 2's pending checkpoint

Points, in the order a step passes them: `update` (optimizer stepped, nothing saved), `pending`
(pending checkpoint written, step not committed), `commit` (step committed, checkpoint not
promoted), `promote` (checkpoint promoted, weights not pushed). Unset in normal runs: a no-op.

With several ranks, the point fires in the rank CRUCIBLE_TRAINER_CRASH_RANK names (default 0; a
follower passes `update` only), and only in the first attempt of `crucible trainer --nproc N --restarts R`
(CRUCIBLE_TRAINER_ATTEMPT 0): the restarted ranks must get past it.
"""

from __future__ import annotations

import logging
import os
import signal

ENV = "CRUCIBLE_TRAINER_CRASH_AT"
RANK_ENV = "CRUCIBLE_TRAINER_CRASH_RANK"
ATTEMPT_ENV = "CRUCIBLE_TRAINER_ATTEMPT"
POINTS = ("update", "pending", "commit", "promote")
log = logging.getLogger(__name__)


def crash_point(point: str, *, step: int) -> None:
    """SIGKILL this process if CRUCIBLE_TRAINER_CRASH_AT names `point:step`; `point` is one of POINTS."""
    if point not in POINTS:
        raise ValueError(f"crash point: expected one of {', '.join(POINTS)}, got {point!r}")
    if os.environ.get(ENV) != f"{point}:{step}" or os.environ.get(ATTEMPT_ENV, "0") != "0":
        return
    if os.environ.get("RANK", "0") == os.environ.get(RANK_ENV, "0"):
        log.warning("crash point %s reached at step %d: killing this process (%s)", point, step, ENV)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
