"""The trajectory store: idempotent episodes, aligned token arrays, closed termination vocabulary."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.db import session_scope
from core.models import Episode, Turn
from core.store import insert_episode
from tests import factories


def _key(group) -> dict:
    return dict(run_id=group.run_id, group_id=group.id, sample_index=0, task_id=group.task_id,
                environment_id=group.environment_id)


def test_inserting_an_episode_twice_with_the_same_key_leaves_one_row(db_session: Session) -> None:
    group = factories.group(db_session)
    db_session.commit()
    first_id, first_new = insert_episode(db_session, **_key(group), status="completed", reward=1.0)
    second_id, second_new = insert_episode(db_session, **_key(group), status="completed", reward=0.0)
    db_session.commit()
    assert (first_new, second_new) == (True, False)
    assert first_id == second_id
    rows = db_session.execute(select(Episode.reward).where(Episode.group_id == group.id)).scalars().all()
    assert rows == [1.0]  # the redelivery did not overwrite the first copy


def test_concurrent_redeliveries_store_one_copy(db_session: Session, engine) -> None:
    group = factories.group(db_session)
    db_session.commit()

    def deliver(_: int) -> tuple[int, bool]:
        with session_scope(engine) as session:
            return insert_episode(session, **_key(group), status="completed")

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(deliver, range(16)))
    assert len({episode_id for episode_id, _ in results}) == 1
    assert sum(new for _, new in results) == 1
    count = db_session.execute(select(func.count()).select_from(Episode)).scalar_one()
    assert count == 1


def test_unknown_termination_reason_is_refused(db_session: Session) -> None:
    group = factories.group(db_session)
    with pytest.raises(IntegrityError, match="reason_known"):
        insert_episode(db_session, **_key(group), termination_reason="gave_up")
    db_session.rollback()


def test_turn_token_arrays_must_align(db_session: Session) -> None:
    group = factories.group(db_session)
    episode_id, _ = insert_episode(db_session, **_key(group))
    db_session.add(Turn(run_id=group.run_id, episode_id=episode_id, index=0, token_ids=[1, 2, 3],
                        logprobs=[0.0, -0.5], loss_mask=[0, 1, 1], prompt_length=1))
    with pytest.raises(IntegrityError, match="token_arrays_aligned"):
        db_session.flush()
    db_session.rollback()


def test_turns_keep_tokens_logprobs_and_mask_exactly(db_session: Session) -> None:
    group = factories.group(db_session)
    episode_id, _ = insert_episode(db_session, **_key(group))
    logprobs = [0.0, -0.125, -3.5]
    db_session.add(Turn(run_id=group.run_id, episode_id=episode_id, index=0, token_ids=[7, 151643, 42],
                        logprobs=logprobs, loss_mask=[0, 1, 1], prompt_length=1, completion_text="ls",
                        observation="README.md"))
    db_session.commit()
    db_session.expire_all()
    turn = db_session.execute(select(Turn).where(Turn.episode_id == episode_id)).scalar_one()
    assert (turn.token_ids, turn.logprobs, turn.loss_mask) == ([7, 151643, 42], logprobs, [0, 1, 1])


def test_reward_components_are_filterable(db_session: Session) -> None:
    group = factories.group(db_session)
    for index, hidden in enumerate([1.0, 0.0, 1.0]):
        key = {**_key(group), "sample_index": index}
        insert_episode(db_session, **key, reward_components={"hidden_tests": hidden, "format": 1.0})
    db_session.commit()
    passed = db_session.execute(
        select(func.count()).select_from(Episode).where(Episode.reward_components["hidden_tests"].as_float() > 0.5)
    ).scalar_one()
    assert passed == 2
