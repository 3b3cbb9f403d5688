"""Reading an archived run's turns (core/archive.py writes the archive): where a run's archive is, and the
turns of some of its episodes, read from the row groups that hold them (found by binary search over the
row groups' episode ranges; the footer is parsed once per file version, after the file's SHA-256 is found
to be the one its run recorded).

    archived = archive.location(session, run_id)      # core/archive.py; None: the turns are in Postgres
    turns = read_turns(archived, episode_ids=[42], columns=("completion_text", "observation"))
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.archive import COLUMNS, FILE_NAME, SCHEMA, Archived, ArchiveError, _directory, _sha256


@dataclass(frozen=True)
class _FileIndex:
    metadata: pq.FileMetaData
    first_episode: list[int]
    """Per row group, in order: its smallest episode id (row groups are in episode order)."""
    last_episode: list[int]


_index_lock = threading.Lock()


@lru_cache(maxsize=64)
def _index(path: str, mtime_ns: int, size: int, sha256: str | None) -> _FileIndex:
    """The parsed footer of an archive file and its row groups' episode ranges (keyed by mtime and size),
    once the file is found to be the one its run recorded (`sha256`; None for a run archived before it
    was recorded): a file changed since it was archived is never read, and checked once per version."""
    if sha256 is not None and _sha256(Path(path)) != sha256:
        raise ArchiveError(f"{path} does not match the SHA-256 recorded on its run when it was archived: it was "
                           "changed since; it is not read")
    metadata = pq.ParquetFile(path).metadata
    column = SCHEMA.get_field_index("episode_id")
    firsts, lasts = [], []
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        firsts.append(int(stats.min))
        lasts.append(int(stats.max))
    return _FileIndex(metadata=metadata, first_episode=firsts, last_episode=lasts)


def read_turns(archived: Archived, *, episode_ids: Sequence[int], columns: Sequence[str],
               root: Path | None = None) -> list[dict[str, Any]]:
    """The archived turns of `episode_ids` (in (episode_id, index) order), with `columns` plus
    episode_id and index; tool_call parsed back from JSON."""
    unknown = set(columns) - set(COLUMNS)
    assert not unknown, unknown
    name = archived.name
    path = _directory(name, root=root) / FILE_NAME
    try:
        stat = path.stat()
    except OSError as error:
        raise ArchiveError(f"archive {name}: {path} cannot be read ({error}); is CRUCIBLE_ARCHIVE_DIR the directory "
                           "the run was archived to?") from error
    with _index_lock:
        index = _index(str(path), stat.st_mtime_ns, stat.st_size, archived.sha256)
    wanted = sorted(set(episode_ids))
    groups: set[int] = set()
    for episode in wanted:  # the row groups whose episode range holds it
        at = bisect.bisect_right(index.first_episode, episode) - 1
        while at >= 0 and index.last_episode[at] >= episode:
            groups.add(at)
            if index.first_episode[at] < episode:
                break
            at -= 1
    if not groups:
        return []
    names = list(dict.fromkeys(["episode_id", "index", *columns]))
    table = pq.ParquetFile(path, metadata=index.metadata).read_row_groups(sorted(groups), columns=names)
    table = table.filter(pc.is_in(table["episode_id"], pa.array(wanted, pa.int64())))
    if "logprobs" in names:  # a REAL as Postgres prints it: the shortest decimal, not the float32's double
        decimal = pc.cast(pc.cast(table["logprobs"], pa.list_(pa.string())), pa.list_(pa.float64()))
        table = table.set_column(names.index("logprobs"), "logprobs", decimal)
    turns: list[dict[str, Any]] = table.to_pylist()
    for row in turns:
        if "tool_call" in row and row["tool_call"] is not None:
            row["tool_call"] = json.loads(row["tool_call"])
    return turns


def forget() -> None:
    """Drop every parsed footer (a restored run's archive is gone)."""
    _index.cache_clear()
