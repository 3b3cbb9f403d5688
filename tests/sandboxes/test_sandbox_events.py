"""EventSink implementations: in-memory, and the DB sink against the real test Postgres."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import SandboxEvent
from sandboxes import EventKind, InMemoryEventSink, SandboxBackend, SandboxSpec, create_sandbox
from sandboxes.db_events import DbEventSink
from sandboxes.events import EventRecorder, SandboxEventData
from tests.support.polling import wait_for


def test_recorder_times_blocks_and_records_errors() -> None:
    sink = InMemoryEventSink()
    recorder = EventRecorder(sink=sink, sandbox_id="sb-1", worker="w")
    with recorder.timed(EventKind.RESET, mode="plain"):
        pass
    try:
        with recorder.timed(EventKind.CREATE):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    reset, create = sink.events
    assert reset.kind is EventKind.RESET and reset.duration_ms is not None and reset.detail == {"mode": "plain"}
    assert create.detail["error"] == "RuntimeError: boom"


def test_db_sink_writes_rows_in_batches_and_on_close(db_session: Session) -> None:
    """Rows are written by a background thread when a batch fills, and by close() for the rest."""
    sink = DbEventSink(batch_size=3, flush_interval_s=3600)
    for kind in (EventKind.CREATE, EventKind.ACQUIRE):
        sink.record(SandboxEventData(sandbox_id="sb-db", kind=kind, duration_ms=1.5, detail={"warm": True}))
    # This sink's rows only: a sink an earlier test left in this process may still flush its own.
    ours = select(SandboxEvent).where(SandboxEvent.sandbox_id == "sb-db").order_by(SandboxEvent.id)
    assert db_session.scalars(ours).all() == []  # buffered
    sink.record(SandboxEventData(sandbox_id="sb-db", kind=EventKind.RESET, container_id="c" * 64))
    wait_for(lambda: len(db_session.scalars(ours).all()) == 3, what="a full batch to be written")
    sink.record(SandboxEventData(sandbox_id="sb-db", kind=EventKind.DESTROY, worker="w1"))
    sink.close()  # flushes the rest
    db_session.expire_all()
    rows = db_session.scalars(ours).all()
    assert [r.kind for r in rows] == ["create", "acquire", "reset", "destroy"]
    assert rows[0].duration_ms == 1.5 and rows[0].detail == {"warm": True}
    assert rows[3].worker == "w1" and rows[0].created_at is not None


def test_sandbox_lifecycle_lands_in_the_database(
    db_session: Session, backend: SandboxBackend, base_spec: SandboxSpec
) -> None:
    sink = DbEventSink()
    sandbox = create_sandbox(backend=backend, spec=base_spec, events=sink, worker="test-worker")
    try:
        sandbox.step("true")
        sandbox.reset()
    finally:
        sandbox.destroy(reason="test")
        sink.close()
    rows = db_session.scalars(select(SandboxEvent).where(SandboxEvent.sandbox_id == sandbox.id)).all()
    assert [r.kind for r in rows] == ["create", "reset", "destroy"]
    assert all(r.duration_ms is not None and r.duration_ms >= 0 for r in rows)
    assert all(r.container_id == sandbox.container_id and r.worker == "test-worker" for r in rows)
    assert rows[-1].detail == {"reason": "test"}
