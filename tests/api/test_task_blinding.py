"""What a user sees of each task's blinded grading (api.services.tasks.blinding_by_task, shown by `crucible
tasks ls` and after `crucible tasks import`): the latest grade's `n/m` tests blinded, a code_repo task
without a reference solution named unblinded, one never graded said so, other kinds nothing."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.services.tasks import blinding_by_task
from tests import factories

HIDDEN = {"files": {"test_hidden.py": "def test_x():\n    assert 1\n"}}


def _layer(blinded: int, graded: int) -> list[dict]:
    return [{"name": "rules", "score": 1.0}, {"name": "hidden_tests", "score": 1.0,
                                              "record": {"blinded": blinded, "graded": graded}}]


def test_each_task_shows_its_latest_blinded_share_or_why_it_has_none(db_session: Session) -> None:
    env = factories.environment(db_session)
    graded = factories.task(db_session, env, payload={"hidden_tests": HIDDEN, "solution": {"files": {"a.py": "x"}}})
    fresh = factories.task(db_session, env, payload={"hidden_tests": HIDDEN, "solution": {"files": {"a.py": "x"}}})
    unsolved = factories.task(db_session, env, payload={"hidden_tests": HIDDEN, "solution": None})
    other = factories.task(db_session, factories.environment(db_session, kind="read_number"), payload={"n": 3})
    first = factories.group(db_session, env=env, task=graded)
    factories.episode(db_session, first, verifier_layers=_layer(3, 5))
    factories.episode(db_session, factories.group(db_session, env=env, task=graded), verifier_layers=_layer(4, 5))
    factories.episode(db_session, factories.group(db_session, env=env, task=graded), verifier_layers="garbage")
    shown = blinding_by_task(db_session, task_ids=[graded.id, fresh.id, unsolved.id, other.id])
    assert shown == {graded.id: "4/5", fresh.id: "not graded yet", unsolved.id: "unblinded: no reference solution"}
    assert blinding_by_task(db_session, task_ids=[]) == {}
