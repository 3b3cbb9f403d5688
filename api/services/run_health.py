"""Why a run is not moving, or not learning, in words: a train run whose groups wait for a trainer nobody
started; a run whose policy's tool calls mostly fail to parse.

A `purpose: train` run only advances when a trainer consumes its complete groups; the controller stops
dispatching once the version bound is reached, so without a trainer the run stays `running` forever.
Whether a trainer is attached is not guessed from timings: every trainer holds the run's Postgres
advisory lock for its whole life (trainer.store.hold_trainer_lock), and a killed trainer's connection
drops and releases it. So: a running train run with complete groups and no holder of that lock is
waiting for a trainer, and says so in its run view (`GET /v1/runs/{id}`, `crucible run follow`).

Tool calls that do not parse (or turns without one) over more than TOOL_CALL_FAILURE_SHARE of the turns
of the run's last TOOL_CALL_WINDOW ended episodes say the same way that the policy and the parser do not
speak one format: most often a spec's explicit `tool_parser` of another chat-template family than the
served model's (core/renderers.py), or a model that was never taught the format.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db import live_trainers
from core.models import Episode, EpisodeGroup, Run
from core.termination import GroupStatus, RunPurpose, RunStatus


def trainer_attached(session: Session, *, run_id: int) -> bool:
    """True while a trainer process holds the run's trainer lock."""
    return bool(live_trainers(session, run_id=run_id))


def waiting_for_trainer(session: Session, *, run: Run) -> str | None:
    """A note when the run's complete groups wait for a trainer that is not running, else None."""
    if run.purpose != RunPurpose.TRAIN or run.status != RunStatus.RUNNING:
        return None
    complete = session.scalar(
        select(func.count()).where(EpisodeGroup.run_id == run.id, EpisodeGroup.status == GroupStatus.COMPLETE)
    ) or 0
    if complete == 0 or trainer_attached(session, run_id=run.id):
        return None
    plural = "group waits" if complete == 1 else "groups wait"
    return (f"waiting for a trainer: {complete} complete {plural} (a step takes {run.batch_size}) and no trainer "
            f"is attached; start one with `crucible trainer --run {run.id}`")


TOOL_CALL_WINDOW = 200
"""The run's latest ended episodes the tool-call failure share is measured over."""
TOOL_CALL_FAILURE_SHARE = 0.2


def tool_call_failures(session: Session, *, run_id: int) -> str | None:
    """A note when more than TOOL_CALL_FAILURE_SHARE of the turns of the run's last TOOL_CALL_WINDOW ended
    episodes held a tool call that did not parse or none at all, else None (from the (run_id, id) index)."""
    latest = (select(Episode.num_turns, Episode.unparsed_tool_calls, Episode.turns_without_tool_call)
              .where(Episode.run_id == run_id, Episode.termination_reason.is_not(None))
              .order_by(Episode.id.desc()).limit(TOOL_CALL_WINDOW).subquery())
    sums = [func.coalesce(func.sum(column), 0) for column in
            (latest.c.num_turns, latest.c.unparsed_tool_calls, latest.c.turns_without_tool_call)]
    episodes, turns, unparsed, missing = session.execute(select(func.count(), *sums)).one()
    if not turns or (unparsed + missing) / turns <= TOOL_CALL_FAILURE_SHARE:
        return None
    return (f"tool calls fail: in the last {episodes} ended episodes, {unparsed} of {turns} turns held a tool call "
            f"that did not parse and {missing} held none ({100 * (unparsed + missing) / turns:.0f}% > "
            f"{100 * TOOL_CALL_FAILURE_SHARE:.0f}%); check that the environment's `tool_parser` is `auto` or the "
            "served model's chat-template family's")
