"""Screening an episode's artifacts before they are stored: the edge where a screenshot the sandbox
produced (bytes the agent may have had a hand in) meets the database.

    screen_artifacts(trajectory.artifacts, num_turns=3)  # → what to store, in order

An artifact is stored as it is only if its name is plain, its media type is on the allow-list, its
bytes are what that type says (a PNG starts like a PNG), it fits the per-artifact and per-episode caps
(core.models.artifact), and it belongs to a turn the episode has. Anything else is replaced by a
small text/plain `not_stored` note saying what was dropped and why: nothing is lost silently, and
the episode is never failed for it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from core.models.artifact import (
    ARTIFACT_MEDIA_TYPES,
    MAX_ARTIFACT_BYTES,
    MAX_EPISODE_ARTIFACT_BYTES,
    MAX_EPISODE_ARTIFACTS,
)
from task_workers.episode.trajectory import ArtifactRecord

logger = logging.getLogger(__name__)

NOTE_NAME = "not_stored"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
"""The first bytes each image type must start with."""


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _refusal(artifact: ArtifactRecord, *, num_turns: int, stored_bytes: int) -> str | None:
    """Why this artifact cannot be stored as it is (None: it can)."""
    name, media_type, data, turn = artifact.name, artifact.media_type, artifact.data, artifact.turn_index
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        return "expected a name of 1-64 letters, digits, '_', '.' or '-'"
    if media_type not in ARTIFACT_MEDIA_TYPES:
        return f"expected a media type of {', '.join(ARTIFACT_MEDIA_TYPES)}"
    if not isinstance(data, bytes | bytearray | memoryview):
        return f"expected bytes, got {type(data).__name__}"
    if turn is not None and (not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn < num_turns):
        return f"expected the opening (no turn) or a turn from 0 to {num_turns - 1}"
    size = len(data)
    if size > MAX_ARTIFACT_BYTES:
        return f"{_mib(size)} is over the cap of {_mib(MAX_ARTIFACT_BYTES)} per artifact"
    if stored_bytes + size > MAX_EPISODE_ARTIFACT_BYTES:
        return f"the episode's artifacts would pass the cap of {_mib(MAX_EPISODE_ARTIFACT_BYTES)} per episode"
    magic = MAGIC.get(media_type)
    if magic is not None and bytes(data[:len(magic)]) != magic:
        return f"the data is not {media_type}: it starts with {bytes(data[:8])!r}"
    return None


def _describe(artifact: ArtifactRecord) -> str:
    data = artifact.data
    size = f"{len(data)} bytes" if isinstance(data, bytes | bytearray | memoryview) else type(data).__name__
    turn = artifact.turn_index
    where = "the opening observation" if turn is None else f"turn {str(turn)[:20]}"
    return f"artifact {str(artifact.name)[:80]!r} ({str(artifact.media_type)[:80]!r}, {size}) of {where}"


def _note(turn_index: int | None, text: str) -> ArtifactRecord:
    return ArtifactRecord(turn_index, NOTE_NAME, "text/plain", text.encode("utf-8", "replace"))


def screen_artifacts(artifacts: Sequence[ArtifactRecord], *, num_turns: int) -> list[ArtifactRecord]:
    """What to store for these artifacts, in order: each one as it is, or a `not_stored` note in its place;
    past MAX_EPISODE_ARTIFACTS rows, one last note counts what was left out."""
    stored: list[ArtifactRecord] = []
    stored_bytes, left_out = 0, 0
    for artifact in artifacts:
        if len(stored) >= MAX_EPISODE_ARTIFACTS - 1:  # the last row is kept for the note below
            left_out += 1
            continue
        reason = _refusal(artifact, num_turns=num_turns, stored_bytes=stored_bytes)
        if reason is None:
            data = bytes(artifact.data)
            stored.append(ArtifactRecord(artifact.turn_index, artifact.name, artifact.media_type, data))
            stored_bytes += len(data)
            continue
        logger.warning("artifact not stored", extra={"artifact": _describe(artifact), "reason": reason})
        turn = artifact.turn_index
        valid_turn = isinstance(turn, int) and not isinstance(turn, bool) and 0 <= turn < num_turns
        stored.append(_note(turn if valid_turn else None, f"{_describe(artifact)} was not stored: {reason}."))
    if left_out:
        stored.append(_note(None, f"{left_out} more artifacts were not stored: an episode keeps at most "
                                  f"{MAX_EPISODE_ARTIFACTS} rows of artifacts."))
    return stored
