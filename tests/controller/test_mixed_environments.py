"""A run that mixes a browser environment with a code environment: the same controller dispatches
groups of both, each to the Celery queue of its kind (`browser` workers run Chromium sandboxes,
`code_repo` workers repositories); the trainer then normalises rewards per environment (tested with
the trainer: tests/trainer/test_batches.py)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from controller.config import ControllerConfig
from controller.dispatch import dispatch_run
from controller.dispatcher import EPISODE_TASK, RecordingDispatcher
from tests import factories as f


def test_a_run_mixing_browser_and_code_environments_dispatches_both_to_their_queues(
    db_session: Session, recorder: RecordingDispatcher, settings: ControllerConfig
) -> None:
    code = f.queued_environment(db_session, name="calc")
    browser = f.queued_environment(db_session, name="miniwob", kind="browser")
    f.tasks(db_session, code, 4)
    f.tasks(db_session, browser, 4)
    run = f.launch(db_session, [code, browser], mode="sync", batch_size=4, group_size=2)
    groups = dispatch_run(db_session, run_id=run.id, dispatcher=recorder, settings=settings).group_ids
    assert len(groups) == 4
    by_env = {g.environment_id for g in f.groups(db_session, run.id)}
    assert by_env == {code.id, browser.id}
    assert {(t.name, t.queue) for t in recorder.sent} == {(EPISODE_TASK, "code_repo"), (EPISODE_TASK, "browser")}
    queue_of = dict(zip(recorder.episode_ids, [t.queue for t in recorder.sent], strict=True))
    for episode in f.episodes(db_session, run.id):
        assert queue_of[episode.id] == ("browser" if episode.environment_id == browser.id else "code_repo")
