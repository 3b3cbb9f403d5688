"""Episodes through the real runner (real dockerd, real Postgres) on a pool of two scripted policy
replicas: every turn is stored with the replica that sampled it, and an episode whose replica starts
failing mid-way finishes on the other with nothing lost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode, Turn
from task_workers.episode.runner import run_episode
from task_workers.policy.client import PolicyClient
from task_workers.policy.pool import PolicyPool
from task_workers.policy.scripted import Reply, ScriptedPolicy, serve
from tests.factories import make_episode
from tests.support.calc import FIX


@pytest.fixture
def two_replicas() -> Iterator[tuple[list[ScriptedPolicy], PolicyPool]]:
    servers = [ScriptedPolicy(), ScriptedPolicy()]
    with serve(servers[0]) as first, serve(servers[1]) as second:
        pool = PolicyPool([first, second], cooldown_s=600.0,
                          client_factory=lambda url: PolicyClient(base_url=url, retries=1, backoff_s=0.05))
        yield servers, pool
        pool.close()


def _stored(session: Session, episode_id: int) -> tuple[Episode, list[Turn]]:
    session.expire_all()
    episode = session.execute(select(Episode).where(Episode.id == episode_id)).scalar_one()
    turns = list(session.execute(select(Turn).where(Turn.episode_id == episode_id).order_by(Turn.index)).scalars())
    return episode, turns


def test_every_stored_turn_names_the_one_replica_that_sampled_it(db_session, two_replicas, sandboxes,
                                                                  code_repo_image, calc_task_payload) -> None:
    servers, pool = two_replicas
    for server in servers:
        server.scripts["fix"] = FIX
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="fix")
    outcome = run_episode(episode_id, policy=pool, sandboxes=sandboxes, worker="test")
    episode, turns = _stored(db_session, episode_id)
    assert outcome.stored and episode.termination_reason == "submitted" and abs(episode.reward - 1.0) < 1e-9
    assert [turn.replica for turn in turns] == [pool.names[0]] * 4  # the first of two idle replicas
    assert [server.requests for server in servers] == [4, 0]
    assert [h.leases for h in pool.health()] == [0, 0]


def test_a_replica_failing_mid_episode_hands_it_to_the_other(db_session, two_replicas, sandboxes, code_repo_image,
                                                              calc_task_payload) -> None:
    servers, pool = two_replicas
    # Replica 0 answers the first two turns, then every request fails (503, as a dying server).
    servers[0].scripts["move"] = [*FIX[:2], *[Reply("", status=503)] * 2]
    servers[1].scripts["move"] = FIX
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="move")
    outcome = run_episode(episode_id, policy=pool, sandboxes=sandboxes, worker="test")
    episode, turns = _stored(db_session, episode_id)
    assert outcome.stored and episode.termination_reason == "submitted"
    assert abs(episode.reward - 1.0) < 1e-9  # the fix made on replica 0 was tested and submitted on replica 1
    assert [turn.tool_call["name"] for turn in turns] == ["bash", "edit_file", "run_tests", "submit"]
    assert [turn.replica for turn in turns] == [pool.names[0]] * 2 + [pool.names[1]] * 2
    # Nothing lost: the episode's stored tokens are one exact stream across the move.
    assert all(turn.loss_mask[turn.prompt_length:] and set(turn.loss_mask[turn.prompt_length:]) == {1}
               for turn in turns)
    assert [h.healthy for h in pool.health()] == [False, True]
