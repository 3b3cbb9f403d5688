"""Episodes end to end with a real dockerd and real Postgres; the policy is scripted (same wire format
as vLLM, token ids and logprobs included) so every outcome is deterministic."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode, EpisodeGroup, Turn
from environments.parsing import hermes_call
from task_workers.episode.runner import run_episode
from task_workers.policy.scripted import IM_END
from tests.factories import make_episode
from tests.support.calc import FIX


def _episode(session: Session, episode_id: int) -> Episode:
    session.expire_all()
    return session.execute(select(Episode).where(Episode.id == episode_id)).scalar_one()


def _turns(session: Session, episode_id: int) -> list[Turn]:
    return list(session.execute(select(Turn).where(Turn.episode_id == episode_id).order_by(Turn.index)).scalars())


def test_a_correct_fix_earns_the_hidden_test_reward(db_session, scripted, sandboxes, policy_client,
                                                    code_repo_image, calc_task_payload) -> None:
    policy, _ = scripted
    policy.scripts["fix"] = FIX
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="fix")
    outcome = run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    episode = _episode(db_session, episode_id)
    assert outcome.stored and episode.status == "completed"
    assert episode.termination_reason == "submitted"
    assert episode.reward_components == {"rules": 1.0, "public_tests": 1.0, "hidden_tests": 1.0}, episode.verifier_layers
    assert abs(episode.reward - 1.0) < 1e-9
    assert [layer["name"] for layer in episode.verifier_layers] == ["rules", "public_tests", "hidden_tests"]
    assert "return a + b" in db_session.get(Episode, episode_id).final_diff
    turns = _turns(db_session, episode_id)
    assert [t.tool_call["name"] for t in turns] == ["bash", "edit_file", "run_tests", "submit"]
    assert "return a - b" in turns[0].observation and turns[0].exit_code == 0
    assert turns[2].exit_code == 0 and "passed" in turns[2].observation
    # Token exactness: each turn is environment tokens (mask 0) then the sampled ones (mask 1) with
    # their behaviour logprobs; the sampled part ends with <|im_end|> as the server returned it.
    for turn in turns:
        sampled = turn.token_ids[turn.prompt_length:]
        assert turn.loss_mask == [0] * turn.prompt_length + [1] * len(sampled)
        assert all(lp == 0.0 for lp in turn.logprobs[:turn.prompt_length])
        assert sampled[-1] == IM_END and all(lp < 0 for lp in turn.logprobs[turn.prompt_length:])
    group = db_session.get(EpisodeGroup, episode.group_id)
    assert group.status == "complete"


def test_a_wrong_fix_gets_no_hidden_reward(db_session, scripted, sandboxes, policy_client, code_repo_image,
                                           calc_task_payload) -> None:
    policy, _ = scripted
    policy.scripts["wrong"] = [hermes_call("edit_file", path="calc.py", old_str="return a - b", new_str="return a * b"),
                               hermes_call("submit")]
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="wrong")
    run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    episode = _episode(db_session, episode_id)
    assert episode.termination_reason == "submitted"
    assert episode.reward_components["hidden_tests"] == 0.0
    assert episode.reward_components["rules"] == 1.0
    assert abs(episode.reward - 0.3) < 1e-9  # rules 0.1 + public 0.2 (mul still passes), hidden 0


def test_editing_a_test_file_is_caught_by_the_rules(db_session, scripted, sandboxes, policy_client,
                                                    code_repo_image, calc_task_payload) -> None:
    policy, _ = scripted
    policy.scripts["cheat"] = [
        hermes_call("write_file", path="tests/test_calc.py", content="def test_mul():\n    assert True\n"),
        hermes_call("edit_file", path="calc.py", old_str="return a - b", new_str="return a + b"),
        hermes_call("submit"),
    ]
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="cheat")
    run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    episode = _episode(db_session, episode_id)
    assert episode.reward == 0.0
    rules = episode.verifier_layers[0]
    assert rules["name"] == "rules" and not rules["passed"]
    assert "flagged: protected_paths" in rules["detail"] and "tests/test_calc.py: changes a protected path" in rules["detail"]
    assert episode.flags == ["protected_paths"]
    assert all(layer["detail"].startswith("not run") for layer in episode.verifier_layers[1:])


def test_max_turns(db_session, scripted, sandboxes, policy_client, code_repo_image, calc_task_payload) -> None:
    policy, _ = scripted
    policy.scripts["dither"] = [hermes_call("bash", command="ls")] * 10
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="dither",
                              max_turns=3)
    run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    episode = _episode(db_session, episode_id)
    assert (episode.termination_reason, episode.num_turns, episode.reward) == ("max_turns", 3, 0.0)
    assert episode.verifier_layers[0]["detail"].startswith("no submission")


def test_a_tool_timeout_is_an_observation_and_the_episode_timeout_ends_it(
    db_session, scripted, sandboxes, policy_client, code_repo_image, calc_task_payload
) -> None:
    """The agent's own time (its tool calls in the sandbox) is what `episode_timeout_s` counts: three
    commands cut at their 1 s timeout spend the 2.5 s budget."""
    policy, _ = scripted
    cut, ls = hermes_call("bash", command="sleep 30", timeout=1), hermes_call("bash", command="ls")
    policy.scripts["slow"] = [cut, ls] * 4  # an ls between: the consecutive tool-error limit is not reached
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="slow",
                              episode_timeout_s=2.5)
    run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    episode = _episode(db_session, episode_id)
    turns = _turns(db_session, episode_id)
    assert turns[0].tool_status == "timeout" and turns[0].exit_code != 0
    assert episode.termination_reason == "episode_timeout" and len(turns) == 5


def test_malformed_tool_calls_end_in_format_error(db_session, scripted, sandboxes, policy_client, code_repo_image,
                                                  calc_task_payload) -> None:
    policy, _ = scripted
    policy.scripts["garbled"] = ["I think I should run ls", '<tool_call>{"name": "bash", </tool_call>',
                                 "<tool_call>{\"name\": \"bash\"", hermes_call("submit")]
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="garbled")
    run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    episode = _episode(db_session, episode_id)
    turns = _turns(db_session, episode_id)
    assert episode.termination_reason == "format_error"
    assert [t.tool_call for t in turns] == [None, None, None]
    assert "No tool call found" in turns[0].observation
    assert "expected JSON inside <tool_call>" in turns[1].observation
    assert "unclosed <tool_call>" in turns[2].observation
    # counted per episode (task_workers/episode/loop.py), the stream never broken
    assert (episode.unparsed_tool_calls, episode.turns_without_tool_call, episode.prefix_breaks) == (2, 1, 0)


def test_context_exhausted(db_session, scripted, sandboxes, policy_client, code_repo_image, calc_task_payload) -> None:
    policy, _ = scripted
    policy.scripts["chatty"] = [hermes_call("bash", command="seq 1 400")] * 10
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="chatty",
                              max_context_tokens=3000, observation_max_chars=1500)
    run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    episode = _episode(db_session, episode_id)
    assert episode.termination_reason == "context_exhausted"
    assert episode.num_tokens <= 3000


def test_running_an_ended_episode_again_stores_nothing(db_session, scripted, sandboxes, policy_client,
                                                      code_repo_image, calc_task_payload) -> None:
    policy, _ = scripted
    policy.scripts["fix"] = FIX
    episode_id = make_episode(db_session, image=code_repo_image, payload=calc_task_payload, script="fix")
    first = run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    second = run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    assert (first.stored, second.stored) == (True, False)
    assert len(_turns(db_session, episode_id)) == 4
