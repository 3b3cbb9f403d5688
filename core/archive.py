"""Archived runs: a finished run's turns moved out of Postgres into a Parquet file, still readable.

    crucible runs archive RUN      turns → CRUCIBLE_ARCHIVE_DIR/run-<id>/turns.parquet, partition emptied
    crucible runs restore RUN      the file → the run's partition again, the archive removed

A run's turns are most of the store (token ids, logprobs and tool output of every turn); once a run
is finished they are read rarely: an episode or a group opened from the dashboard. The file holds the
run's turns in (episode_id, index) order, in row groups of ROW_GROUP_TURNS turns, so reading one
episode reads one or two row groups, found by binary search over the row groups' episode ranges
(the footer is parsed once per file and cached). Everything about the episodes (rewards, terminations,
groups, step metrics) stays in Postgres: lists, filters and the run page are unchanged. What an
archived run loses is full-text search over its turns (`q=`): the search index lives in Postgres.

Archiving writes the file beside its final name, checks that it reads back the run's row count, and
only then, in one transaction that locks the partition, records the archive on the run and empties
the partition (TRUNCATE: its disk space is returned at once; the empty table stays attached).
Restoring checks the file's SHA-256 against the one recorded on the run when it was written (not the
manifest's: whoever can rewrite the file can rewrite the manifest) before a row goes back in, and reads
check it once per file version before the footer is trusted. Either command
that fails part-way leaves the run as it was: its turns in Postgres, or in a complete archive.

The archive directory must be shared by every host that serves the API (a network mount): the run
row stores the archive's name relative to it, never a server path a request could steer. Reading an
archived run's turns: core/archive_reader.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from core.durable import fsync_path
from core.errors import CrucibleError, NotFound
from core.models import Episode, Run
from core.settings import get_settings
from core.termination import OUTSTANDING, RunStatus

FORMAT = 1
LOCK_TIMEOUT_S = 30
ROW_GROUP_TURNS = 2048
FILE_NAME, MANIFEST_NAME = "turns.parquet", "manifest.json"
FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.STOPPED)

SCHEMA = pa.schema([
    ("run_id", pa.int64()), ("episode_id", pa.int64()), ("index", pa.int32()),
    ("token_ids", pa.list_(pa.int32())), ("logprobs", pa.list_(pa.float32())), ("loss_mask", pa.list_(pa.int16())),
    ("prompt_length", pa.int32()), ("completion_text", pa.string()), ("tool_call", pa.string()),
    ("observation", pa.string()), ("tool_output_full", pa.string()), ("exit_code", pa.int32()),
    ("tool_status", pa.string()), ("duration_s", pa.float64()), ("generation_s", pa.float64()),
    ("truncated", pa.bool_()), ("truncated_bytes", pa.int32()), ("weight_version", pa.int32()),
    ("weight_version_end", pa.int32()), ("version_runs", pa.list_(pa.int32())), ("replica", pa.string()),
    ("finish_reason", pa.string()), ("segment", pa.int32()),
    ("created_at", pa.timestamp("us", tz="UTC")),
])
"""Every stored column of `turns` (not `search`, which Postgres derives); tool_call as JSON text; logprobs
as the REALs (float32) they are, read back as the shortest decimal, as Postgres prints them. An archive
written before a column existed restores it as NULL (version_runs) or as its default (segment: 0) (`_conform`)."""
ABSENT = {"segment": 0}
"""A column an older archive lacks that is not nullable: the value its rows restore with."""
COLUMNS = tuple(SCHEMA.names)
COLUMN_LIST = ", ".join(f'"{name}"' if name == "index" else name for name in COLUMNS)
"""COLUMNS as SQL, for the archive's SELECT and the restore's COPY."""


class ArchiveError(CrucibleError):
    """The run cannot be archived or restored in its present state, or its archive is not usable."""


@dataclass(frozen=True)
class ArchiveReport:
    run_id: int
    turns: int
    episodes: int
    bytes: int
    seconds: float
    path: str


def archive_root() -> Path:
    settings = get_settings()
    return settings.archive_dir or settings.data_dir / "archive"


def _directory(name: str, *, root: Path | None = None) -> Path:
    """The archive `name` (as stored on the run: `run-<id>`) under the root; anything else is refused."""
    base = (root or archive_root()).resolve()
    path = (base / name).resolve()
    if re.fullmatch(r"run-[0-9]{1,19}", name) is None or path.parent != base:
        raise ArchiveError(f"archive_path: expected a directory 'run-<id>' in {base}, got {name!r}")
    return path


def _run(session: Session, run_id: int, *, lock: bool = False) -> Run:
    query = select(Run).where(Run.id == run_id)
    run = session.execute(query.with_for_update() if lock else query).scalar_one_or_none()
    if run is None:
        raise NotFound(f"no run with id {run_id}; `crucible run ls` lists them")
    return run


def _partition(session: Session, run_id: int) -> str | None:
    """The name of the run's own partition of `turns`, if it has one (not the legacy one it may share)."""
    name = f"turns_run_{run_id}"
    attached = session.execute(text(
        "SELECT 1 FROM pg_inherits WHERE inhparent = 'turns'::regclass AND inhrelid = to_regclass(:name)"
    ), {"name": name}).scalar_one_or_none()
    return name if attached else None


def _rows(engine: Engine, run_id: int) -> Iterator[list[tuple[Any, ...]]]:
    """The run's turns in (episode_id, index) order, ROW_GROUP_TURNS at a time, from a server-side cursor
    (binary: arrays and timestamps are parsed in C), so memory stays flat however large the run."""
    query = (f"SELECT {COLUMN_LIST.replace('tool_call', 'tool_call::text')} FROM turns WHERE run_id = %s "
             "ORDER BY episode_id, index")
    with engine.connect() as conn, conn.begin():
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor(name="crucible_archive", binary=True) as cursor:
            cursor.execute(query, (run_id,))
            while rows := cursor.fetchmany(ROW_GROUP_TURNS):
                yield rows


def _batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays([pa.array(values, type=field.type) for values, field in zip(columns, SCHEMA,
                                                                                                   strict=True)],
                                      schema=SCHEMA)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_archivable(session: Session, run: Run) -> None:
    if run.archived_at is not None:
        raise ArchiveError(f"run {run.id} is already archived (in {run.archive_path}); "
                           f"`crucible runs restore {run.id}` brings it back")
    if run.status not in FINISHED:
        raise ArchiveError(f"run {run.id}: expected a finished run ({', '.join(FINISHED)}), got one that is "
                           f"{run.status}; stop it first")
    live = session.execute(select(Episode.id).where(
        Episode.run_id == run.id, Episode.status.in_(OUTSTANDING)).limit(1)
    ).scalar_one_or_none()
    if live is not None:
        raise ArchiveError(f"run {run.id} still has episodes in flight (episode {live}); archive it once they end")


def archive_run(engine: Engine, run_id: int, *, root: Path | None = None) -> ArchiveReport:
    """Move the turns of finished run `run_id` into its archive; see the module docstring."""
    started = time.perf_counter()
    with Session(engine) as session:
        _check_archivable(session, _run(session, run_id))
    name = f"run-{run_id}"
    directory = _directory(name, root=root)
    scratch = directory.parent / f".{name}-{uuid.uuid4().hex[:12]}"  # written apart; renamed when it is whole
    scratch.mkdir(parents=True)
    try:
        turns, episodes, digest = _write(engine, run_id, scratch / FILE_NAME)
        _remove_turns(engine, run_id, turns=turns, digest=digest, scratch=scratch, directory=directory)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # gone already once renamed into place
    return ArchiveReport(run_id=run_id, turns=turns, episodes=episodes, bytes=(directory / FILE_NAME).stat().st_size,
                         seconds=time.perf_counter() - started, path=str(directory))


def _write(engine: Engine, run_id: int, file: Path) -> tuple[int, int, str]:
    """The run's turns into `file` with its manifest beside it; returns (turns, episodes, the file's SHA-256)."""
    turns = 0
    episodes: set[int] = set()
    with pq.ParquetWriter(file, SCHEMA, compression="zstd") as writer:
        for rows in _rows(engine, run_id):
            batch = _batch(rows)
            writer.write_batch(batch, row_group_size=ROW_GROUP_TURNS)
            turns += batch.num_rows
            episodes.update(row[1] for row in rows)
    if pq.ParquetFile(file).metadata.num_rows != turns:
        raise ArchiveError(f"run {run_id}: the archive reads back a different number of turns than was written")
    fsync_path(file)  # on disk before the partition is emptied
    digest = _sha256(file)
    manifest = {"format": FORMAT, "run_id": run_id, "turns": turns, "episodes": len(episodes),
                "bytes": file.stat().st_size, "sha256": digest, "archived_at": datetime.now(UTC).isoformat()}
    (file.parent / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    fsync_path(file.parent / MANIFEST_NAME)
    fsync_path(file.parent)
    return turns, len(episodes), digest


def _remove_turns(engine: Engine, run_id: int, *, turns: int, digest: str, scratch: Path, directory: Path) -> None:
    """In one transaction: check the run is still unarchived and no turn arrived since the file was
    written, put the archive in place, record it on the run and empty the run's partition (TRUNCATE: its
    storage goes back at once; the empty partition stays attached, so restoring needs no DDL on `turns`).
    A run from before partitioning shares turns_legacy: DELETE."""
    with Session(engine) as session, session.begin():
        session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_S}s'"))
        run = _run(session, run_id, lock=True)  # one archive, restore or resume of a run at a time
        _check_archivable(session, run)  # again: it may have been resumed while the file was written
        partition = _partition(session, run_id)
        try:  # no turn of the run is written (nor read) between the count and the delete
            session.execute(text(f"LOCK TABLE {partition or 'turns_legacy'} IN "
                                 f"{'ACCESS EXCLUSIVE' if partition else 'SHARE ROW EXCLUSIVE'} MODE"))
        except OperationalError as error:
            raise ArchiveError(f"run {run_id}: its turns stayed in use for {LOCK_TIMEOUT_S} s; nothing was removed, "
                               "archive it again") from error
        held = session.execute(text("SELECT count(*) FROM turns WHERE run_id = :run"), {"run": run_id}).scalar_one()
        if held != turns:
            raise ArchiveError(f"run {run_id}: {held - turns} turns arrived while it was archived; nothing was "
                               "removed, archive it again")
        if partition:
            session.execute(text(f"TRUNCATE {partition}"))
        else:
            session.execute(text("DELETE FROM turns WHERE run_id = :run"), {"run": run_id})
        run.archived_at, run.archive_path, run.archive_sha256 = datetime.now(UTC), directory.name, digest
        shutil.rmtree(directory, ignore_errors=True)  # a stale one from an attempt whose commit failed
        scratch.rename(directory)
        fsync_path(directory.parent)


def _conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with SCHEMA's columns in SCHEMA's order; a column an older archive lacks is all NULL."""
    names = set(batch.schema.names)
    columns = [batch.column(field.name) if field.name in names
               else pa.array([ABSENT[field.name]] * batch.num_rows, type=field.type) if field.name in ABSENT
               else pa.nulls(batch.num_rows, type=field.type) for field in SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def _csv(batch: pa.RecordBatch) -> bytes:
    """The batch as COPY's CSV, arrays written as Postgres array literals, all in Arrow's C++ (restoring a
    million turns row by row through Python would take minutes). A float32 logprob prints as its
    shortest decimal, which Postgres reads back to the same REAL."""
    columns = []
    for column, field in zip(batch.columns, SCHEMA, strict=True):
        if pa.types.is_list(field.type):
            joined = pc.binary_join(pc.cast(column, pa.list_(pa.string())), ",")
            column = pc.binary_join_element_wise("{", joined, "}", "")
        columns.append(column)
    out = io.BytesIO()
    pa_csv.write_csv(pa.RecordBatch.from_arrays(columns, names=list(COLUMNS)), out,
                     pa_csv.WriteOptions(include_header=False, quoting_style="needed"))
    return out.getvalue()


def manifest(name: str, *, root: Path | None = None) -> dict[str, Any]:
    path = _directory(name, root=root) / MANIFEST_NAME
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError) as error:
        raise ArchiveError(f"archive {name}: its manifest {path} cannot be read ({error})") from error


def restore_run(engine: Engine, run_id: int, *, root: Path | None = None) -> ArchiveReport:
    """Put archived run `run_id`'s turns back into its partition and remove the archive."""
    started = time.perf_counter()
    with Session(engine) as session:
        run = _run(session, run_id)
        archived = checked(run_id, run.archive_path, run.archive_sha256)
        if archived is None:
            raise ArchiveError(f"run {run_id} is not archived: its turns are in Postgres")
    name = archived.name
    directory = _directory(name, root=root)
    expected = manifest(name, root=root)
    file = directory / FILE_NAME
    recorded = archived.sha256 or expected.get("sha256")  # runs archived before 0009: the manifest's
    if not file.is_file() or _sha256(file) != recorded:
        raise ArchiveError(f"run {run_id}: {file} is missing or does not match the SHA-256 recorded when it was "
                           "archived; nothing was restored")
    episodes: set[int] = set()
    with Session(engine) as session, session.begin():
        if _run(session, run_id, lock=True).archive_path != name:
            raise ArchiveError(f"run {run_id} was restored meanwhile; nothing was done")
        session.execute(text("SELECT crucible_turns_partition(:run)"), {"run": run_id})
        raw = session.connection().connection.driver_connection
        assert raw is not None
        turns = 0
        with raw.cursor() as cursor, cursor.copy(f"COPY turns ({COLUMN_LIST}) FROM STDIN (FORMAT csv)") as copy:
            for batch in pq.ParquetFile(file).iter_batches(batch_size=ROW_GROUP_TURNS * 8):
                strangers = pc.filter(batch.column("run_id"), pc.not_equal(batch.column("run_id"), run_id))
                if len(strangers):
                    raise ArchiveError(f"run {run_id}: its archive holds a turn of run {strangers[0].as_py()}; "
                                       "nothing was restored")
                copy.write(_csv(_conform(batch)))
                episodes.update(pc.unique(batch.column("episode_id")).to_pylist())
                turns += batch.num_rows
        if turns != expected.get("turns"):
            raise ArchiveError(f"run {run_id}: expected {expected.get('turns')} turns in the archive, read {turns}")
        session.execute(text("UPDATE runs SET archived_at = NULL, archive_path = NULL, archive_sha256 = NULL "
                             "WHERE id = :run"),
                        {"run": run_id})
    size = file.stat().st_size
    shutil.rmtree(directory)
    from core.archive_reader import forget  # it reads what this module writes

    forget()
    return ArchiveReport(run_id=run_id, turns=turns, episodes=len(episodes), bytes=size,
                         seconds=time.perf_counter() - started, path=str(directory))


@dataclass(frozen=True)
class Archived:
    """Where a run's turns are archived and the file's SHA-256 its run recorded."""

    name: str
    """`run-<id>`, under the archive root."""
    sha256: str | None
    """None for a run archived before migration 0009 recorded it."""


def location(session: Session, run_id: int) -> Archived | None:
    """The run's archive when its turns are archived, else None (they are in Postgres)."""
    row = session.execute(select(Run.archive_path, Run.archive_sha256).where(Run.id == run_id)).one_or_none()
    return None if row is None else checked(run_id, row.archive_path, row.archive_sha256)


def checked(run_id: int, name: str | None, sha256: str | None) -> Archived | None:
    """The archive named by run `run_id`'s row (archive_path, archive_sha256), if the name is that run's."""
    if name is None:
        return None
    if name != f"run-{run_id}":
        raise ArchiveError(f"run {run_id}: archive_path: expected a directory 'run-<id>' named for the run, "
                           f"got {name!r}")
    return Archived(name=name, sha256=sha256)

