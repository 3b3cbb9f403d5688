"""The code task of `make rl-mixed` (recipes/mixed_rl.py) played by a scripted policy through the real
runner, real Docker sandboxes and the real grader: copying the number earns 1; the shortcuts a policy
would try (rewriting number.txt to match its guess, writing the hidden test itself, a wrong number)
earn 0."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode as EpisodeRow
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from recipes.mixed_rl import EXPERT_COMMAND, HIDDEN_TEST, code_payload, code_spec
from task_workers.episode.runner import run_episode
from tests import factories

pytestmark = pytest.mark.docker

NUMBER = 47
SUBMIT = hermes_call("submit")


def play(session: Session, *, image: str, script: str, policy, sandboxes, client) -> EpisodeRow:
    spec = code_spec()  # the scripted policy's tokens are bytes: its calls need more of them than the tiny model's
    spec = {**spec, "image": image, "limits": {**spec["limits"], "max_response_tokens": 256, "max_context_tokens": 4096}}
    env, _ = register_environment(session, spec=parse_spec(spec))
    task = factories.task(session, env, external_id=f"n-{script}", instruction=f"Copy it. [script:{script}]",
                          payload=json.loads(json.dumps(code_payload(NUMBER))))
    episode_id = factories.pending_episode(session, env=env, the_task=task, run_name=f"mixed-{script}")
    run_episode(episode_id, policy=client, sandboxes=sandboxes, worker="mixed")
    session.expire_all()
    episode = session.execute(select(EpisodeRow).where(EpisodeRow.id == episode_id)).scalar_one()
    assert (episode.status, episode.failures) == ("completed", []), episode.failures
    return episode


def test_the_hidden_test_holds_the_number_not_a_reference_to_the_file() -> None:
    assert "number.txt" not in HIDDEN_TEST.format(n=NUMBER) and f'"{NUMBER}"' in HIDDEN_TEST.format(n=NUMBER)


@pytest.mark.parametrize(("script", "calls", "reward"), [
    ("copy", [hermes_call("bash", command=EXPERT_COMMAND), SUBMIT], 1.0),
    ("typed", [hermes_call("bash", command=f"echo {NUMBER} > answer.txt"), SUBMIT], 1.0),
    ("wrong", [hermes_call("bash", command="echo 12 > answer.txt"), SUBMIT], 0.0),
    ("rewrite-both", [hermes_call("bash", command="echo 12 > number.txt && echo 12 > answer.txt"), SUBMIT], 0.0),
    ("own-test", [hermes_call("bash", command="printf 'def test_answer_holds_the_number():\\n    pass\\n' > test_hidden.py"
                                            " && echo 12 > answer.txt"), SUBMIT], 0.0),
    ("nothing", [SUBMIT], 0.0),
])
def test_only_the_number_itself_earns_the_reward(
    script, calls, reward, db_session, scripted, sandboxes, policy_client, code_repo_image
) -> None:
    policy, _ = scripted
    policy.scripts[script] = calls
    episode = play(db_session, image=code_repo_image, script=script, policy=policy, sandboxes=sandboxes,
                   client=policy_client)
    assert episode.termination_reason == "submitted"
    assert episode.reward == pytest.approx(reward), episode.reward_components
