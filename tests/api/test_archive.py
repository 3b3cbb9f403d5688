"""`crucible runs archive` / `restore` (core/archive.py): a finished run's turns leave Postgres for a
Parquet file and every API answer about its episodes, groups and tokens stays byte-for-byte the same;
restoring brings them back exactly. Refusals, a tampered archive, a steered archive path and a search
over an archived run each give a clear error and change nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.main import app as cli
from controller.errors import InvalidRunState
from controller.runs import resume_run
from core import archive
from core.errors import NotFound
from core.models import Episode, Run, Turn
from tests.api.trajectories import SeededRun


def _finish(session: Session, run_id: int) -> None:
    """End the seeded run: its still-running rollouts cancelled, the run completed."""
    session.execute(update(Episode).where(Episode.run_id == run_id, Episode.status.in_(("pending", "running")))
                    .values(status="cancelled"))
    session.execute(update(Run).where(Run.id == run_id).values(status="completed"))
    session.commit()


def _answers(client: TestClient, seeded: SeededRun) -> dict[str, Any]:
    """Every API answer that reads the run's turns."""
    paths = [f"/v1/groups/{group}" for group in seeded.group_ids]
    for episode in (e for group in seeded.episode_ids for e in group):
        paths += [f"/v1/episodes/{episode}", f"/v1/episodes/{episode}?tokens=true",
                  f"/v1/episodes/{episode}/turns/0/tokens", f"/v1/episodes/{episode}/turns/99/tokens"]
    answers = {}
    for path in paths:
        response = client.get(path)
        answers[path] = (response.status_code, response.json())
    return answers


def _turns_in_postgres(session: Session, run_id: int) -> int:
    count = session.execute(select(func.count()).select_from(Turn).where(Turn.run_id == run_id)).scalar_one()
    session.commit()  # no transaction of the test holds the partition while the archive empties it
    return int(count)


def test_an_archived_run_reads_the_same_and_restores_exactly(client: TestClient, seeded: SeededRun,
                                                             db_session: Session, engine: Engine,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups of three turns: episodes span row groups, found by the binary search over their ranges."""
    monkeypatch.setattr(archive, "ROW_GROUP_TURNS", 3)
    _finish(db_session, seeded.run_id)
    stored = _turns_in_postgres(db_session, seeded.run_id)
    assert stored > 0
    with_turns = sum(_has_turns(db_session, e) for group in seeded.episode_ids for e in group)
    before = _answers(client, seeded)
    assert sum(status == 200 for status, _ in before.values()) > len(before) // 2

    report = archive.archive_run(engine, seeded.run_id)
    assert (report.turns, report.episodes) == (stored, with_turns)
    db_session.expire_all()
    assert _turns_in_postgres(db_session, seeded.run_id) == 0
    size = db_session.execute(text("SELECT pg_relation_size(:n)"), {"n": f"turns_run_{seeded.run_id}"}).scalar()
    assert size == 0  # TRUNCATE gave the partition's storage back
    run = db_session.get(Run, seeded.run_id)
    assert run is not None and run.archive_path == f"run-{seeded.run_id}" and run.archived_at is not None
    db_session.commit()
    assert pq.ParquetFile(Path(report.path) / archive.FILE_NAME).metadata.num_row_groups == -(-stored // 3)
    assert _answers(client, seeded) == before  # read from Parquet now
    assert client.get(f"/runs/{seeded.run_id}").status_code == 200  # the dashboard's run page
    episode = seeded.episode_ids[0][0]
    assert client.get(f"/episodes/{episode}").status_code == 200  # and an episode page

    restored = archive.restore_run(engine, seeded.run_id)
    assert restored.turns == stored
    db_session.expire_all()
    assert _turns_in_postgres(db_session, seeded.run_id) == stored
    assert db_session.get(Run, seeded.run_id).archive_path is None  # type: ignore[union-attr]
    db_session.commit()
    assert not Path(report.path).exists()
    assert [p.name for p in Path(report.path).parent.iterdir()] == []  # no scratch directory left either
    assert _answers(client, seeded) == before
    # and it can go round again: the partition was made anew
    archive.archive_run(engine, seeded.run_id)
    assert _answers(client, seeded) == before


def _has_turns(session: Session, episode_id: int) -> bool:
    count = session.execute(select(func.count()).select_from(Turn).where(Turn.episode_id == episode_id)).scalar_one()
    session.commit()
    return bool(count)


def test_archiving_refuses_a_live_run_and_twice(seeded: SeededRun, db_session: Session, engine: Engine) -> None:
    with pytest.raises(archive.ArchiveError, match=r"expected a finished run .* got one that is running"):
        archive.archive_run(engine, seeded.run_id)
    db_session.execute(update(Run).where(Run.id == seeded.run_id).values(status="stopped"))
    db_session.commit()
    with pytest.raises(archive.ArchiveError, match="still has episodes in flight"):
        archive.archive_run(engine, seeded.run_id)
    with pytest.raises(archive.ArchiveError, match="is not archived"):
        archive.restore_run(engine, seeded.run_id)
    with pytest.raises(NotFound, match="no run with id 424242"):
        archive.archive_run(engine, 424242)
    assert _turns_in_postgres(db_session, seeded.run_id) > 0
    _finish(db_session, seeded.run_id)
    archive.archive_run(engine, seeded.run_id)
    with pytest.raises(archive.ArchiveError, match="already archived"):
        archive.archive_run(engine, seeded.run_id)


def test_a_tampered_archive_is_not_restored(seeded: SeededRun, db_session: Session, engine: Engine) -> None:
    _finish(db_session, seeded.run_id)
    report = archive.archive_run(engine, seeded.run_id)
    file = Path(report.path) / archive.FILE_NAME
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(archive.ArchiveError, match="does not match the SHA-256 recorded when it was archived; "
                                                   "nothing was restored"):
        archive.restore_run(engine, seeded.run_id)
    db_session.expire_all()
    assert _turns_in_postgres(db_session, seeded.run_id) == 0
    assert db_session.get(Run, seeded.run_id).archive_path is not None  # type: ignore[union-attr]


def test_a_forged_manifest_naming_another_run_is_not_restored(seeded: SeededRun, db_session: Session,
                                                              engine: Engine) -> None:
    """A manifest rewritten to match a swapped-in file cannot put turns under another run, even for a run
    archived before its hash was recorded on the row (then the manifest's is all there is)."""
    _finish(db_session, seeded.run_id)
    report = archive.archive_run(engine, seeded.run_id)
    db_session.execute(update(Run).where(Run.id == seeded.run_id).values(archive_sha256=None))
    db_session.commit()
    directory = Path(report.path)
    table = pq.read_table(directory / archive.FILE_NAME)
    other = table.set_column(0, "run_id", [[seeded.run_id + 1] * table.num_rows])
    pq.write_table(other, directory / archive.FILE_NAME)
    manifest = json.loads((directory / archive.MANIFEST_NAME).read_text())
    manifest["sha256"] = archive._sha256(directory / archive.FILE_NAME)
    (directory / archive.MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(archive.ArchiveError, match=f"holds a turn of run {seeded.run_id + 1}; nothing was restored"):
        archive.restore_run(engine, seeded.run_id)
    db_session.expire_all()
    assert _turns_in_postgres(db_session, seeded.run_id) == 0


def test_an_archive_rewritten_with_its_manifest_is_neither_read_nor_restored(
    client: TestClient, seeded: SeededRun, db_session: Session, engine: Engine
) -> None:
    """Whoever can write the archive directory can rewrite the file and the manifest together (here: a
    completion changed, the manifest's hash recomputed). The hash recorded on the run row is the witness:
    the API answers 409 instead of the forged turn, and restore refuses before a row goes in."""
    _finish(db_session, seeded.run_id)
    episode = seeded.episode_ids[0][0]
    report = archive.archive_run(engine, seeded.run_id)
    directory = Path(report.path)
    table = pq.read_table(directory / archive.FILE_NAME)
    texts = table.column("completion_text").to_pylist()
    forged = table.set_column(table.schema.get_field_index("completion_text"), "completion_text",
                              [["forged: all tests pass"] * len(texts)])
    pq.write_table(forged, directory / archive.FILE_NAME, row_group_size=archive.ROW_GROUP_TURNS)
    manifest = json.loads((directory / archive.MANIFEST_NAME).read_text())
    manifest["sha256"] = archive._sha256(directory / archive.FILE_NAME)
    (directory / archive.MANIFEST_NAME).write_text(json.dumps(manifest))

    response = client.get(f"/v1/episodes/{episode}")
    assert response.status_code == 409, response.text
    assert "does not match the SHA-256 recorded on its run" in response.json()["error"]["message"]
    assert client.get(f"/v1/episodes/{episode}/turns/0/tokens").status_code == 409
    assert client.get(f"/v1/groups/{seeded.group_ids[0]}").status_code == 409
    with pytest.raises(archive.ArchiveError, match="does not match the SHA-256 recorded when it was archived"):
        archive.restore_run(engine, seeded.run_id)
    db_session.expire_all()
    assert _turns_in_postgres(db_session, seeded.run_id) == 0



@pytest.mark.parametrize("steered", ["../../etc", "/etc", "run-1/../../x", "other", "", "run-", "run-1/../run-2",
                                     "run-2"])
def test_an_archive_path_that_leaves_the_archive_root_is_refused(client: TestClient, seeded: SeededRun,
                                                                 db_session: Session, engine: Engine,
                                                                 steered: str) -> None:
    """Should the run row say something else, nothing outside CRUCIBLE_ARCHIVE_DIR is ever opened."""
    _finish(db_session, seeded.run_id)
    archive.archive_run(engine, seeded.run_id)
    db_session.execute(update(Run).where(Run.id == seeded.run_id).values(archive_path=steered))
    db_session.commit()
    episode = seeded.episode_ids[0][0]
    response = client.get(f"/v1/episodes/{episode}")
    assert response.status_code == 409
    assert "expected a directory 'run-<id>'" in response.json()["error"]["message"]
    assert client.get(f"/v1/episodes/{episode}/turns/0/tokens").status_code == 409
    with pytest.raises(archive.ArchiveError, match="expected a directory 'run-<id>'"):
        archive.restore_run(engine, seeded.run_id)


def test_search_says_an_archived_run_is_not_searchable(client: TestClient, seeded: SeededRun,
                                                       db_session: Session, engine: Engine) -> None:
    _finish(db_session, seeded.run_id)
    word = "pytest"
    assert client.get("/v1/episodes", params={"q": word}).json()["data"]  # found while in Postgres
    archive.archive_run(engine, seeded.run_id)
    response = client.get("/v1/episodes", params={"run_id": seeded.run_id, "q": word})
    assert response.status_code == 409
    assert f"run {seeded.run_id} is archived" in response.json()["error"]["message"]
    assert "crucible runs restore" in response.json()["error"]["message"]
    assert client.get("/v1/episodes", params={"q": word}).json()["data"] == []  # other runs only
    assert client.get("/v1/episodes", params={"run_id": seeded.run_id}).json()["data"]  # lists are unchanged


def test_the_cli_archives_and_restores_and_says_what_is_wrong(seeded: SeededRun, db_session: Session) -> None:
    runner = CliRunner()
    refused = runner.invoke(cli, ["runs", "archive", str(seeded.run_id)])
    assert refused.exit_code == 2 and "expected a finished run" in refused.output
    assert runner.invoke(cli, ["runs", "archive", "-5"]).exit_code != 0
    assert "no run with id 999999" in runner.invoke(cli, ["runs", "archive", "999999"]).output
    _finish(db_session, seeded.run_id)
    done = runner.invoke(cli, ["runs", "archive", str(seeded.run_id), "-o", "json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["turns"] > 0
    back = runner.invoke(cli, ["run", "restore", str(seeded.run_id)])
    assert back.exit_code == 0 and "turns of" in back.output


def test_an_archived_run_cannot_be_resumed(seeded: SeededRun, db_session: Session, engine: Engine) -> None:
    """Its new turns would go to Postgres while its old ones are read from the file."""
    _finish(db_session, seeded.run_id)
    db_session.execute(update(Run).where(Run.id == seeded.run_id).values(status="stopped"))
    db_session.commit()
    archive.archive_run(engine, seeded.run_id)
    with pytest.raises(InvalidRunState, match=f"run {seeded.run_id} is archived; `crucible runs restore"):
        resume_run(db_session, run_id=seeded.run_id)
    db_session.rollback()
    archive.restore_run(engine, seeded.run_id)
    assert resume_run(db_session, run_id=seeded.run_id).status in ("running", "pending")


def test_an_archive_written_before_version_runs_existed_restores_them_as_null() -> None:
    """Issue 23 added turns.version_runs: a Parquet file from before has no such column; the restore's
    COPY gets NULL there (the trainer then labels the turn's tokens with its oldest version)."""
    import pyarrow as pa

    older = pa.schema([field for field in archive.SCHEMA if field.name != "version_runs"])
    row = {field.name: None for field in older}
    row.update(run_id=1, episode_id=2, index=0, token_ids=[5, 6], logprobs=[0.0, -1.0], loss_mask=[0, 1],
               prompt_length=1, completion_text="x", truncated=False, truncated_bytes=0, weight_version=3)
    batch = pa.RecordBatch.from_pylist([row], schema=older)
    conformed = archive._conform(batch)
    assert conformed.schema == archive.SCHEMA and conformed.column("version_runs").to_pylist() == [None]
    assert conformed.column("weight_version").to_pylist() == [3]
    assert b"{5,6}" in archive._csv(conformed)
