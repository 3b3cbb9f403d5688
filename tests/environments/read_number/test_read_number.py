"""The demo's read_number environment, end to end through the real episode runner in a Docker sandbox;
the policy is scripted (vLLM's wire format) so each outcome is deterministic. Also: its demonstrations
are token for token what the runner stores for the same actions."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode, Turn
from environments.parsing import hermes_call
from environments.read_number.task import make_tasks
from environments.sandboxes import DockerSandboxes
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.episode.runner import run_episode
from task_workers.policy.client import PolicyClient
from task_workers.policy.scripted import ScriptedPolicy, serve
from tests import factories
from tests.support.rewards import assert_reward_derived

SPEC = {"name": "read-number-scripted", "kind": "read_number", "image": "code-repo",
        "sandbox": {"memory": "256m", "pids": 64, "workspace_size": "16m", "tmp_size": "16m", "max_lifetime_s": 600},
        "limits": {"max_turns": 3, "episode_timeout_s": 60, "tool_timeout_s": 5, "max_tool_errors": 2},
        "verifier": {"weights": {"answer": 1.0}}}

SANDBOX_WORKER = "read-number-test"  # names this module's sandboxes (`module_sandboxes`: tests/support/sandbox_fixtures.py)


def _episode(session: Session, *, script: str) -> int:
    env, _ = register_environment(session, spec=parse_spec(SPEC))
    the_task = factories.task(session, env, external_id=f"t-{script}",
                              instruction=f"The file value.txt holds a number. Read it and submit it. [script:{script}]",
                              payload={"path": "value.txt", "number": "4821"})
    return factories.pending_episode(session, env=env, the_task=the_task, run_name=f"read-number-{script}")


@pytest.mark.parametrize(("script", "reward"), [
    ([hermes_call("bash", command="cat value.txt"), hermes_call("submit", answer="4821")], 1.0),
    ([hermes_call("bash", command="ls"), hermes_call("submit", answer="4812")], 0.0),
    ([hermes_call("submit", answer="4821")], 1.0),  # a lucky guess is still right: the verifier checks the answer
])
def test_reading_and_submitting_the_number_is_rewarded(
    db_session: Session, module_sandboxes: DockerSandboxes, script: list[str], reward: float,
) -> None:
    policy = ScriptedPolicy({"s": script})
    with serve(policy) as url:
        client = PolicyClient(base_url=url, retries=1, backoff_s=0.05)
        episode_id = _episode(db_session, script="s")
        run_episode(episode_id, policy=client, sandboxes=module_sandboxes, worker="test")
        client.close()
    db_session.expire_all()
    episode = db_session.get(Episode, episode_id)
    assert episode is not None and episode.termination_reason == "submitted"
    assert episode.reward == reward and episode.reward_components["answer"] == reward
    assert_reward_derived(db_session, [episode_id])
    turns = db_session.execute(select(Turn).where(Turn.episode_id == episode_id).order_by(Turn.index)).scalars()
    first = next(iter(turns))
    if len(script) == 2 and "cat" in script[0]:
        assert first.observation == "4821\n"


def test_the_discover_workspace_prints_what_the_sandbox_prints(
    db_session: Session, module_sandboxes: DockerSandboxes,
) -> None:
    """recipes/discover.py renders its demonstrations' turns without a sandbox, and bench/discover_proxy.py
    plays against the same `Workspace`: the listing of the one file, the failed `cat` and the one that
    reads the file must be, byte for byte, what the runner stores for the same calls."""
    from recipes.discover import Workspace, missing

    script = [hermes_call("bash", command="ls"), hermes_call("bash", command="cat box.txt"),
              hermes_call("bash", command="cat value.txt")]
    with serve(ScriptedPolicy({"blind": script})) as url:
        client = PolicyClient(base_url=url, retries=1, backoff_s=0.05)
        episode_id = _episode(db_session, script="blind")
        run_episode(episode_id, policy=client, sandboxes=module_sandboxes, worker="test")
        client.close()
    db_session.expire_all()
    turns = db_session.execute(select(Turn).where(Turn.episode_id == episode_id).order_by(Turn.index)).scalars().all()
    workspace = Workspace({"value.txt": "4821"})
    stored = [t.observation for t in turns]
    assert stored == ["value.txt\n", missing("box.txt"), "4821\n"]
    assert stored == [workspace.run(command) for command in ("ls", "cat box.txt", "cat value.txt")]


def test_demonstrations_match_what_the_runner_stores(tokenizer) -> None:
    """A demonstration's tokens are the chat-template prompt, the call, the observation framing the
    runner appends, the submit call — with the runner's mask layout."""
    from environments.read_number.demos import demonstration, tool_call_text
    from task_workers.policy.chat import observation_text

    task = make_tasks(count=1, split="train", seed=0, digits=(2, 2), file_names=("number.txt",))[0]
    ids, mask = demonstration(task, tokenizer=tokenizer, observation_text=observation_text)
    text = tokenizer.decode(ids)
    assert text.endswith(observation_text(f"{task.payload.number}\n", completion_closed=True)
                         + tool_call_text("submit", {"answer": task.payload.number}) + "<|im_end|>")
    assert len(ids) == len(mask) and mask[0] == 0 and mask[-1] == 1
    spans = [m for i, m in enumerate(mask) if i == 0 or mask[i - 1] != m]
    assert spans == [0, 1, 0, 1]  # prompt, bash call, observation, submit call
    guess_ids, guess_mask = demonstration(task, tokenizer=tokenizer, observation_text=observation_text, guess="17",
                                          short=True)
    assert tokenizer.decode(guess_ids).endswith(tool_call_text("submit", {"answer": "17"}) + "<|im_end|>")
    assert len(guess_ids) < len(ids) and sum(guess_mask) < sum(mask)
