"""(issue 24) A tarball's members are counted as they stream: a small tar.gz of very many empty members
is refused at the bound, with memory that does not grow with what it holds."""

from __future__ import annotations

import base64
import gzip
import tarfile
import tracemalloc

import pytest

from core.errors import ConfigError
from environments.code_repo import snapshot
from environments.code_repo.snapshot import RepoSnapshot, check_snapshot

BOUND = 20_000  # the module's bound (50,000) checked at a smaller size: the same loop, a shorter test


def _tarball(members: int) -> RepoSnapshot:
    """`members` empty files (one header each, the same name: tar allows it), gzip'd: tens of KB."""
    raw = tarfile.TarInfo("f").tobuf(format=tarfile.GNU_FORMAT) * members + b"\0" * 1024
    return RepoSnapshot(format="tar", data_b64=base64.b64encode(gzip.compress(raw, compresslevel=1)).decode())


def test_many_empty_members_are_refused_at_the_bound_with_flat_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "MAX_MEMBERS", BOUND)
    bomb = _tarball(BOUND + 1_000)
    assert len(bomb.data_b64) < 2**20  # small to send: the work is all in the members
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=rf"repo: expected at most {BOUND} files and"):
            check_snapshot(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # tarfile's buffers, not a TarInfo kept per member (~8 MB here; ~90 MB at 250k before the fix).
    assert peak < 3 * 2**20, peak


def test_a_tarball_at_the_bound_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "MAX_MEMBERS", BOUND)
    check_snapshot(_tarball(BOUND))
