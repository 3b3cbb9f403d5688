"""A browser episode as the worker stores it: per-turn actions, accessibility trees and screenshots
(real PNGs), written through the worker's own claim_episode/store_episode into the test database.

    episode_id = stored_browser_episode(db_session, run_name="browser-1")
"""

from __future__ import annotations

import struct
import zlib

from sqlalchemy.orm import Session

from core.termination import TerminationReason
from task_workers.episode.persist import claim_episode, store_episode
from task_workers.episode.trajectory import ArtifactRecord, Trajectory, TurnRecord
from tests import factories

GOAL = "Click the button labelled Submit."
OPENING_TREE = "[1] RootWebArea 'Task'\n  [7] button 'Cancel'\n  [8] button 'Submit'"
ACTIONS = [{"name": "click", "arguments": {"bid": "7"}}, {"name": "click", "arguments": {"bid": "8"}}]
TREES = ["[1] RootWebArea 'Task'\n  [7] button 'Cancel' focused\n  [8] button 'Submit'",
         "[1] RootWebArea 'Task'\n  StaticText 'Done: reward 1'"]


def png(width: int, height: int, rgb: tuple[int, int, int] = (47, 91, 211)) -> bytes:
    """A valid PNG of one colour (what a screenshot is, minus the page)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))  # filter byte 0, then RGB pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def browser_turn(index: int, *, action: dict, tree: str) -> TurnRecord:
    return TurnRecord(
        index=index, token_ids=[1, 2, 3], logprobs=[0.0, -0.5, -0.25], loss_mask=[0, 1, 1], prompt_length=1,
        completion_text=f"<tool_call>{action}</tool_call>", finish_reason="stop", generation_s=0.1,
        weight_version=0, weight_version_end=0, tool_call=action, observation=tree[:60], tool_output_full=tree,
        exit_code=None, tool_status="ok", duration_s=0.05, truncated=len(tree) > 60,
    )


def browser_trajectory(*, extra: list[ArtifactRecord] | None = None) -> Trajectory:
    """Two clicks; the opening observation (text + screenshot) and a screenshot after each turn."""
    turns = [browser_turn(i, action=action, tree=tree) for i, (action, tree) in enumerate(zip(ACTIONS, TREES, strict=True))]
    artifacts = [
        ArtifactRecord(None, "observation", "text/plain", f"Goal: {GOAL}\n\n{OPENING_TREE}".encode()),
        ArtifactRecord(None, "screenshot", "image/png", png(160, 90, (200, 200, 200))),
        ArtifactRecord(0, "screenshot", "image/png", png(160, 90, (47, 91, 211))),
        ArtifactRecord(1, "screenshot", "image/png", png(160, 90, (31, 122, 61))),
        *(extra or []),
    ]
    return Trajectory(turns=turns, artifacts=artifacts, submitted=True, termination=TerminationReason.SUBMITTED)


def stored_browser_episode(session: Session, *, run_name: str, trajectory: Trajectory | None = None) -> int:
    """A pending single-sample browser episode, claimed and stored as the worker does; committed."""
    env = factories.environment(session, kind="browser", spec={"image": "crucible/browser"})
    the_task = factories.task(session, env, instruction=GOAL)
    episode_id = factories.pending_episode(session, env=env, the_task=the_task, run_name=run_name)
    assert claim_episode(session, episode_id=episode_id, worker="worker-test") is not None
    assert store_episode(session, episode_id=episode_id, trajectory=trajectory or browser_trajectory(), verdict=None, reward=None,
                         sandbox_id="sb-browser", timings={"total": 1.0})
    session.commit()
    return episode_id
