"""Episode artifacts (screenshots, the opening observation) on real Postgres: stored in the episode's own
transaction, screened at the edge (a bad type, bad bytes or an oversized file becomes a note saying
why, never a failed episode), and stored once however often the episode is delivered."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.models import Episode, EpisodeArtifact, Run, Turn
from core.models.artifact import MAX_ARTIFACT_BYTES, MAX_EPISODE_ARTIFACT_BYTES, MAX_EPISODE_ARTIFACTS
from task_workers.episode.artifacts import NOTE_NAME, screen_artifacts
from task_workers.episode.persist import claim_episode, store_episode
from task_workers.episode.trajectory import ArtifactRecord
from tests import factories
from tests.support.browser_episode import browser_trajectory, png, stored_browser_episode

PNG = png(4, 4)


def _artifacts(session: Session, episode_id: int) -> list[EpisodeArtifact]:
    session.expire_all()
    query = select(EpisodeArtifact).where(EpisodeArtifact.episode_id == episode_id).order_by(EpisodeArtifact.id)
    return list(session.execute(query).scalars())


def _count(session: Session, model: type[Turn] | type[EpisodeArtifact], episode_id: int) -> int:
    return session.execute(select(func.count()).select_from(model).where(model.episode_id == episode_id)).scalar_one()


def _episode(session: Session, episode_id: int) -> Episode:
    episode = session.get(Episode, episode_id)
    assert episode is not None
    return episode


def _pending(session: Session, name: str) -> int:
    env = factories.environment(session, kind="browser")
    return factories.pending_episode(session, env=env, the_task=factories.task(session, env), run_name=name)


def test_artifacts_are_stored_with_their_turns(db_session: Session) -> None:
    trajectory = browser_trajectory()
    episode_id = stored_browser_episode(db_session, run_name="stored", trajectory=trajectory)
    rows = _artifacts(db_session, episode_id)
    episode = _episode(db_session, episode_id)
    assert [(row.turn_index, row.name, row.media_type) for row in rows] == [
        (None, "observation", "text/plain"), (None, "screenshot", "image/png"), (0, "screenshot", "image/png"),
        (1, "screenshot", "image/png")]
    assert [row.data for row in rows] == [artifact.data for artifact in trajectory.artifacts]
    assert all(row.size == len(row.data) and row.run_id == episode.run_id for row in rows)
    assert b"Goal: Click the button labelled Submit." in rows[0].data
    assert _count(db_session, Turn, episode_id) == 2


def test_artifacts_and_turns_commit_or_roll_back_together(db_session: Session) -> None:
    """A turn Postgres refuses (misaligned token arrays) fails the whole store: no artifact is left behind."""
    episode_id = _pending(db_session, "atomic")
    claim_episode(db_session, episode_id=episode_id, worker="w")
    db_session.commit()
    broken = browser_trajectory()
    broken.turns[1] = replace(broken.turns[1], logprobs=[0.0])
    with pytest.raises(IntegrityError):
        store_episode(db_session, episode_id=episode_id, trajectory=broken, verdict=None, reward=None, sandbox_id=None, timings={})
    db_session.rollback()
    assert _count(db_session, EpisodeArtifact, episode_id) == 0 and _count(db_session, Turn, episode_id) == 0

    assert store_episode(db_session, episode_id=episode_id, trajectory=browser_trajectory(), verdict=None, reward=None,
                         sandbox_id=None, timings={})
    assert _count(db_session, EpisodeArtifact, episode_id) == 4  # visible in the same transaction as the turns
    db_session.rollback()
    assert _count(db_session, EpisodeArtifact, episode_id) == 0 and _count(db_session, Turn, episode_id) == 0


def test_a_redelivered_episode_stores_one_copy(db_session: Session) -> None:
    episode_id = stored_browser_episode(db_session, run_name="redelivered")
    assert claim_episode(db_session, episode_id=episode_id, worker="w2") is None
    assert not store_episode(db_session, episode_id=episode_id, trajectory=browser_trajectory(), verdict=None, reward=None,
                             sandbox_id=None, timings={})
    db_session.commit()
    assert len(_artifacts(db_session, episode_id)) == 4


BAD = [  # (artifact, words the note must contain)
    (ArtifactRecord(0, "page", "text/html", b"<script>alert(document.cookie)</script>"), "media type"),
    (ArtifactRecord(0, "page", "image/svg+xml", b"<svg onload=alert(1)><script>x</script></svg>"), "media type"),
    (ArtifactRecord(0, "shot", "IMAGE/PNG", PNG), "media type"),
    (ArtifactRecord(0, "shot", "image/png; charset=utf-8", PNG), "media type"),
    (ArtifactRecord(0, "shot", "application/octet-stream", PNG), "media type"),
    (ArtifactRecord(0, "shot", "x" * 10_000, PNG), "media type"),
    (ArtifactRecord(0, "shot", "image/png", b"<html><script>alert(1)</script></html>"), "is not image/png"),
    (ArtifactRecord(0, "shot", "image/jpeg", PNG), "is not image/jpeg"),
    (ArtifactRecord(0, "shot", "image/png", b""), "is not image/png"),
    (ArtifactRecord(0, "shot", "image/png", PNG + b"\0" * MAX_ARTIFACT_BYTES), "per artifact"),
    (ArtifactRecord(0, "", "image/png", PNG), "name"),
    (ArtifactRecord(0, "../../etc/passwd", "image/png", PNG), "name"),
    (ArtifactRecord(0, "a" * 65, "image/png", PNG), "name"),
    (ArtifactRecord(0, "shot\x00", "image/png", PNG), "name"),
    (ArtifactRecord(0, "<img src=x onerror=alert(1)>", "image/png", PNG), "name"),
    (ArtifactRecord(0, "shot", "text/plain", "a str, not bytes"), "expected bytes"),  # type: ignore[arg-type]
    (ArtifactRecord(2, "shot", "image/png", PNG), "turn from 0 to 1"),
    (ArtifactRecord(-1, "shot", "image/png", PNG), "turn from 0 to 1"),
    (ArtifactRecord(2**40, "shot", "image/png", PNG), "turn from 0 to 1"),
    (ArtifactRecord(True, "shot", "image/png", PNG), "turn from 0 to 1"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("bad", "why"), BAD, ids=[f"{a.name[:12]}-{str(a.media_type)[:20]}-{why}" for a, why in BAD])
def test_a_bad_artifact_is_replaced_by_a_note(db_session: Session, bad: ArtifactRecord, why: str) -> None:
    episode_id = stored_browser_episode(db_session, run_name="bad", trajectory=browser_trajectory(extra=[bad]))
    rows = _artifacts(db_session, episode_id)
    assert [row.name for row in rows[:4]] == ["observation", "screenshot", "screenshot", "screenshot"]
    note = rows[4]
    assert len(rows) == 5 and (note.name, note.media_type) == (NOTE_NAME, "text/plain")
    text = note.data.decode()
    assert "was not stored" in text and why in text and len(note.data) < 1000
    valid_turn = bad.turn_index in (0, 1) and not isinstance(bad.turn_index, bool)
    assert note.turn_index == (bad.turn_index if valid_turn else None)  # beside its turn, else at the opening
    assert not any(b"<script>" in row.data for row in rows)
    assert _episode(db_session, episode_id).status == "completed"


def test_the_caps_are_inclusive() -> None:
    at_cap = PNG + b"\0" * (MAX_ARTIFACT_BYTES - len(PNG))
    kept = screen_artifacts([ArtifactRecord(0, "shot", "image/png", at_cap),
                             ArtifactRecord(None, "empty", "text/plain", b"")], num_turns=1)
    assert [(a.name, len(a.data)) for a in kept] == [("shot", MAX_ARTIFACT_BYTES), ("empty", 0)]


def test_the_episode_cap_drops_what_does_not_fit_and_says_so() -> None:
    at_cap = PNG + b"\0" * (MAX_ARTIFACT_BYTES - len(PNG))  # one object, many references: cheap
    fit = MAX_EPISODE_ARTIFACT_BYTES // MAX_ARTIFACT_BYTES
    small = ArtifactRecord(None, "observation", "text/plain", b"small")
    records = [small, *(ArtifactRecord(i % 3, "shot", "image/png", at_cap) for i in range(fit)), small]
    kept = screen_artifacts(records, num_turns=3)
    # The first small one leaves room for one screenshot fewer; the last still fits in what is left.
    assert [a.name for a in kept] == ["observation", *["shot"] * (fit - 1), NOTE_NAME, "observation"]
    assert sum(len(a.data) for a in kept if a.name != NOTE_NAME) == MAX_EPISODE_ARTIFACT_BYTES - MAX_ARTIFACT_BYTES + 10
    assert kept[fit].turn_index == (fit - 1) % 3 and b"per episode" in kept[fit].data


def test_the_row_cap_folds_the_rest_into_one_note() -> None:
    records = [ArtifactRecord(0, "shot", "image/png", PNG)] * (MAX_EPISODE_ARTIFACTS + 5)
    kept = screen_artifacts(records, num_turns=1)
    assert len(kept) == MAX_EPISODE_ARTIFACTS
    assert kept[-1].name == NOTE_NAME and kept[-1].data.startswith(b"6 more artifacts were not stored")


def test_the_table_refuses_what_the_screen_would(db_session: Session) -> None:
    """Defence in depth: a row written around the worker still cannot hold HTML or lie about its size."""
    episode_id = stored_browser_episode(db_session, run_name="table")
    run_id = _episode(db_session, episode_id).run_id
    for row in (dict(media_type="text/html", size=3, data=b"<b>"), dict(media_type="image/png", size=1, data=PNG)):
        db_session.add(EpisodeArtifact(run_id=run_id, episode_id=episode_id, turn_index=None, name="x", **row))
        with pytest.raises(IntegrityError):
            db_session.flush()
        db_session.rollback()


def test_deleting_the_run_deletes_its_artifacts(db_session: Session) -> None:
    episode_id = stored_browser_episode(db_session, run_name="deleted")
    db_session.execute(delete(Run).where(Run.id == _episode(db_session, episode_id).run_id))
    db_session.commit()
    assert _count(db_session, EpisodeArtifact, episode_id) == 0
