"""The episode's JSON records (core.schemas.episode): what a writer may store, and what a reader gets back."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.schemas.episode import FailureRecord, LayerRecord, ToolCallRecord
from environments.base import LayerResult
from task_workers.episode.persist import layer_record


def test_a_failure_is_stored_without_its_absent_fields_and_read_back_as_written() -> None:
    stored = FailureRecord(reason="worker_lost", worker="w1", source="reconcile", incarnation="abc").stored()
    assert set(stored) == {"reason", "at", "worker", "source", "incarnation"}
    [read] = FailureRecord.read_all([stored])
    assert (read.reason, read.worker, read.source, read.attempt) == ("worker_lost", "w1", "reconcile", None)
    assert FailureRecord.read_all(None) == [] and FailureRecord.read_all([]) == []


@pytest.mark.parametrize("fields", [
    {"reason": "judge_error", "attempt": "the third"},  # a wrong type
    {"reason": "judge_error", "atempt": 3},  # a misspelt field
    {"reason": "sandbox_error", "message": "x" * 1001},  # longer than the column keeps
    {"message": "no reason"},
])
def test_a_writer_cannot_store_a_failure_of_another_shape(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        FailureRecord.model_validate(fields)


@pytest.mark.parametrize("entry", [3, "lost", None, {"reason": "worker_lost", "source": ["reconcile"]}])
def test_a_reader_that_counts_failures_refuses_an_entry_that_is_not_one(entry: object) -> None:
    """Counting a surprising entry as nothing would let a lost episode be requeued past its limit."""
    with pytest.raises(ValidationError):
        FailureRecord.read_all([FailureRecord(reason="worker_lost").stored(), entry])


def test_a_layer_is_stored_with_its_detail_cut_to_what_the_column_keeps() -> None:
    stored = layer_record(LayerResult(name="hidden_tests", score=0.5, passed=False, detail="x" * 9000 + "end",
                                      duration_s=1.23456789))
    assert stored["detail"].endswith("end") and len(stored["detail"]) == 4000
    assert stored["duration_s"] == 1.2346 and "record" not in stored
    [read] = LayerRecord.read_all([stored])
    assert (read.name, read.score, read.passed) == ("hidden_tests", 0.5, False)
    with pytest.raises(ValidationError):
        LayerRecord(name="judge", score="high", passed=True)  # type: ignore[arg-type]


def test_a_tool_call_has_a_name_and_an_object_of_arguments() -> None:
    assert ToolCallRecord(name="bash", arguments={"command": "ls"}).stored() == {"name": "bash",
                                                                                 "arguments": {"command": "ls"}}
    with pytest.raises(ValidationError):
        ToolCallRecord.model_validate({"name": "bash", "arguments": ["ls"]})
