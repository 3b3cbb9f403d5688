"""OpenEnv environments in Crucible (the `openenv` kind), through the real worker: the environment's own
OpenEnv server from PyPI (openenv-core's `openenv init` echo environment) in a real sandbox with no
network, the bridge over the attached stream, the real episode runner and store, a scripted policy.

The reward is the environment's own `Observation.reward`, stored as the `openenv` layer; each episode is a
new session on the server (reset isolation); what the agent can send is the action schema and nothing else.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Turn
from core.models.episode import Episode
from core.termination import TerminationReason
from environments.openenv.images import RECIPES, openenv_image
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.episode.runner import run_episode
from tests import factories
from tests.support.rewards import assert_reward_derived

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("openenv")]


@pytest.fixture(scope="module")
def echo_image(sandbox_images: dict[str, str]) -> str:
    return openenv_image("echo", RECIPES["echo"], base_tag=sandbox_images["base"])


def echo_spec(image: str, script: str, **extra: object) -> dict:
    return {"name": f"echo-{script}".lower().replace("_", "-")[:100], "kind": "openenv", "image": image,
            "openenv": {"app": RECIPES["echo"].app, "tool": "say", **extra.pop("openenv", {})},  # type: ignore[dict-item]
            "sandbox": {"memory": "1g", "max_lifetime_s": 900},
            "limits": {"max_turns": 3, "episode_timeout_s": 120, "max_tool_errors": 3},
            "system_prompt": f"Say things. [script:{script}]", **extra}


def make_openenv_episode(session: Session, *, spec: dict, payload: dict, external_id: str = "echo-0") -> int:
    env, _ = register_environment(session, spec=parse_spec(spec))
    task = factories.task(session, env, external_id=external_id, instruction="Echo a message.", payload=payload)
    return factories.pending_episode(session, env=env, the_task=task, run_name=f"run-{env.name}-{external_id}")


def play(db_session, scripted, policy_client, sandboxes, image, *, script, steps, payload=None, **extra) -> Episode:
    scripted[0].scripts[script] = steps
    episode_id = make_openenv_episode(db_session, spec=echo_spec(image, script, **extra), payload=payload or {},
                                      external_id=f"echo-{script}")
    run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    db_session.expire_all()
    episode = db_session.get(Episode, episode_id)
    assert episode is not None
    if episode.status == "completed":
        assert_reward_derived(db_session, [episode_id])
    return episode


def turns_of(db_session, episode: Episode) -> list[Turn]:
    return list(db_session.execute(select(Turn).where(Turn.episode_id == episode.id).order_by(Turn.index)).scalars())


def say(message: str) -> str:
    return hermes_call("say", message=message)


def test_the_environments_own_reward_is_the_layer(db_session, scripted, policy_client, sandboxes, echo_image):
    """The echo environment rewards 0.1 × the length: a 10-character message earns 1, a 3-character one 0.3."""
    long = play(db_session, scripted, policy_client, sandboxes, echo_image, script="long",
                steps=[say("hi"), say("0123456789")], payload={"seed": 1})
    assert long.termination_reason == TerminationReason.MAX_TURNS or long.reward == pytest.approx(1.0)
    layer = long.verifier_layers[0]
    assert layer["name"] == "openenv" and long.reward == pytest.approx(1.0), long.verifier_layers
    short = play(db_session, scripted, policy_client, sandboxes, echo_image, script="short",
                 steps=[say("0123456789"), say("abc")], payload={"seed": 1})
    assert short.reward == pytest.approx(0.3)  # `reward: last`: the last observation's
    summed = play(db_session, scripted, policy_client, sandboxes, echo_image, script="summed",
                  steps=[say("0123456789"), say("abc")], payload={"seed": 1}, openenv={"reward": "sum"})
    assert summed.reward == pytest.approx(1.3)
    turns = turns_of(db_session, long)
    assert [t.tool_call["name"] for t in turns[:2]] == ["say", "say"]
    assert "echoed_message: 0123456789" in turns[1].observation
    assert all("reward" not in (t.observation or "") for t in turns)  # the agent never sees a reward


def test_each_episode_meets_a_new_instance(sandboxes, echo_image):
    """Reset isolation: three episodes in one warm sandbox (its server started once), each through the kind
    as the runner drives it; each meets a new instance of the environment: the server's own state, read
    after each, counts only that episode's steps and names an episode id of its own."""
    from environments.base import ToolCall
    from environments.openenv.kind import OpenEnvKind
    from environments.openenv.task import OpenEnvTask

    spec = parse_spec(echo_spec(echo_image, "isolation"))
    records = []
    with sandboxes.lease(spec=spec, run_id=None, episode_id=None) as sandbox:
        for steps in (3, 1, 2):
            kind = OpenEnvKind(spec)
            task = OpenEnvTask(seed=steps)
            kind.setup(sandbox=sandbox, task=task)
            for _ in range(steps):
                kind.execute(sandbox=sandbox, call=ToolCall("say", {"message": "four"}), task=task)
            verdict = kind.verify(sandbox=sandbox, task=task, submitted=False, open_sandbox=None,  # type: ignore[arg-type]
                                  actions=[])
            records.append(verdict.layers[0].record)
    assert [r["state"]["step_count"] for r in records] == [3, 1, 2]  # not 3, 4, 6: a new instance each time
    assert len({r["state"]["episode_id"] for r in records}) == 3
    assert [r["rewards"] for r in records] == [[0.4] * 3, [0.4], [0.4] * 2]
    assert len({r["server_pid"] for r in records}) == 1  # `server: kept`: one server, a session per episode


def test_a_server_per_episode_is_a_new_process_each_time(sandboxes, echo_image):
    """`server: per_episode`, for environments that run the agent's code in their own process: each episode's
    server is a new process; another spec on the same image gets a bridge of its own settings."""
    from environments.openenv.kind import OpenEnvKind
    from environments.openenv.task import OpenEnvTask

    fresh = parse_spec(echo_spec(echo_image, "fresh", openenv={"server": "per_episode"}))
    pids = []
    with sandboxes.lease(spec=fresh, run_id=None, episode_id=None) as sandbox:
        for seed in range(3):
            kind = OpenEnvKind(fresh)
            kind.setup(sandbox=sandbox, task=OpenEnvTask(seed=seed))
            pids.append(kind.server_pid)
        other = parse_spec(echo_spec(echo_image, "other", openenv={"env": {"ECHO_SETTING": "2"}}))
        kind = OpenEnvKind(other)
        kind.setup(sandbox=sandbox, task=OpenEnvTask(seed=0))
        assert sandbox._openenv.hello["env"] == {"ECHO_SETTING": "2"}  # not the first spec's server
    assert len(set(pids)) == 3, pids


def test_what_the_agent_sends_is_the_action_and_nothing_else(db_session, scripted, policy_client, sandboxes,
                                                             echo_image):
    """Hostile calls are tool errors the agent sees, and none of them moves the reward: a field the schema
    does not have (`metadata`, `reward`), a wrong type, another tool."""
    steps = [hermes_call("say", message="x", reward=1.0), hermes_call("say", message="x", metadata={"r": 1}),
             hermes_call("say", message=12), hermes_call("bash", command="id"), say("ok")]
    episode = play(db_session, scripted, policy_client, sandboxes, echo_image, script="hostile", steps=steps,
                   payload={"seed": 4}, limits={"max_turns": 6, "episode_timeout_s": 120, "max_tool_errors": 6,
                                                "max_context_tokens": 8192})
    turns = turns_of(db_session, episode)
    observations = [t.observation or "" for t in turns]
    assert "expected names among message, got reward" in observations[0]
    assert "got metadata" in observations[1]
    assert "refused the action" in observations[2]
    assert "expected say, got \"bash\"" in observations[3]
    assert episode.reward == pytest.approx(0.2), (episode.reward, observations)  # "ok": only the valid call counts


def test_saying_nothing_never_pays_more_than_the_spec_says(db_session, scripted, policy_client, sandboxes,
                                                           echo_image):
    """An episode none of whose calls reached the environment was never scored by it: it earns the spec's
    no_action_reward (an environment that pays −20 for a wrong answer must not pay 0 for silence), and the
    layer says why."""
    silent = play(db_session, scripted, policy_client, sandboxes, echo_image, script="silent",
                  steps=["I will not call a tool.", hermes_call("say", message=7)], payload={"seed": 5},
                  openenv={"no_action_reward": -5.0})
    assert silent.reward == pytest.approx(-5.0), silent.verifier_layers
    assert "no action reached the environment" in silent.verifier_layers[0]["detail"]


def test_bad_specs_and_tasks_are_refused_at_the_edge():
    from pydantic import ValidationError

    from core.errors import ConfigError
    from environments.openenv.task import OpenEnvTask

    base = echo_spec("crucible-openenv/echo:latest", "x")
    refusals = {
        "openenv.app": {"app": "echo; rm -rf /"},
        "openenv.app_dir": {"app": "echo_env.server.app:app", "app_dir": "/opt/../etc"},
        "openenv.app_dir ": {"app": "echo_env.server.app:app", "app_dir": "/tmp"},
        "openenv.env ": {"app": "a:b", "env": {"LD_PRELOAD": "/tmp/x.so"}},
        "openenv.env  ": {"app": "a:b", "env": {"PYTHONPATH": "/tmp"}},
        "openenv.env   ": {"app": "a:b", "env": {"HF_HUB_OFFLINE": "0"}},
        "openenv.env": {"app": "a:b", "env": {"lower": "x"}},
        "openenv.tool": {"app": "a:b", "tool": "Say Things"},
        "openenv.reward": {"app": "a:b", "reward": "max"},
        "openenv.no_action_reward": {"app": "a:b", "no_action_reward": float("inf")},
    }
    for field, bad in refusals.items():
        with pytest.raises(ConfigError, match=field.strip().replace(".", r"\.")):
            parse_spec({**base, "openenv": bad})
    with pytest.raises(ConfigError, match="openenv: expected a section"):
        parse_spec({k: v for k, v in base.items() if k != "openenv"})
    with pytest.raises(ConfigError, match="only for kind openenv"):
        parse_spec({**base, "kind": "read_number"})
    with pytest.raises(ConfigError, match="expected distinct names"):
        parse_spec({**base, "tools": ["bash"]})
    for payload in ({"seed": -1}, {"seed": 2**40}, {"options": {"seed": 3}}, {"options": {"episode_id": "x"}},
                    {"options": {"x": "y" * 20_000}}, {"surprise": 1}, {"options": {"nan": float("nan")}}):
        with pytest.raises(ValidationError):
            OpenEnvTask.model_validate(payload)


def test_an_action_past_the_size_bound_never_reaches_the_environment():
    """The bound the worker puts on an action (a response-token limit usually cuts such a call first)."""
    from environments.base import ToolCall
    from environments.openenv.kind import MAX_ACTION_BYTES, OpenEnvKind, action_tool
    from environments.openenv.task import OpenEnvTask

    class Session:
        calls: list[dict] = []

        def call(self, op: str, **params: object) -> dict:
            self.calls.append({"op": op, **params})
            return {"observation": {}, "reward": 1.0, "done": False}

    kind = OpenEnvKind(parse_spec(echo_spec("crucible-openenv/echo:latest", "bound")))
    kind._tool = action_tool("say", {"properties": {"message": {"type": "string"}}, "required": ["message"]})
    kind._session = Session()
    result = kind.execute(sandbox=None, call=ToolCall("say", {"message": "y" * MAX_ACTION_BYTES}),  # type: ignore[arg-type]
                          task=OpenEnvTask())
    assert result.status == "error" and f"expected at most {MAX_ACTION_BYTES} bytes" in result.observation
    assert Session.calls == []


class FakeBridge:
    """The bridge's replies, scripted: what a server of any behaviour could send (tests the kind's rules)."""

    def __init__(self, replies: list) -> None:
        self.replies, self.info, self.episodes = list(replies), {"schema": {"action": {
            "properties": {"message": {"type": "string"}}, "required": ["message"]}}, "pid": 1}, 0

    def call(self, op: str, **params: object) -> dict:
        if op == "state":
            return {"state": {}}
        if op == "reset":
            return {"observation": {}, "reward": None, "done": False}
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def score(replies: list, calls: int | None = None, **settings: object) -> tuple[float, str]:
    from environments.base import ToolCall
    from environments.openenv.kind import OpenEnvKind
    from environments.openenv.task import OpenEnvTask
    from environments.rewards import total

    class Box:
        def openenv(self, **hello: object) -> FakeBridge:
            return bridge

    bridge = FakeBridge(replies)
    kind = OpenEnvKind(parse_spec(echo_spec("crucible-openenv/echo:latest", "rules",
                                            openenv={"no_action_reward": -5.0, **settings})))
    task = OpenEnvTask(seed=0)
    kind.setup(sandbox=Box(), task=task)  # type: ignore[arg-type]
    for _ in range(len(replies) if calls is None else calls):
        result = kind.execute(sandbox=None, call=ToolCall("say", {"message": "m"}), task=task)  # type: ignore[arg-type]
        if result.ends_episode:
            break
    verdict = kind.verify(sandbox=None, task=task, submitted=False, open_sandbox=None, actions=[])  # type: ignore[arg-type]
    return total(verdict.layers, verdict.flags, kind.spec).value, verdict.layers[0].detail


def step(reward: object, done: bool = False) -> dict:
    return {"observation": {"echoed_message": "m"}, "reward": reward, "done": done}


def test_what_the_server_sends_is_scored_by_rules_a_policy_cannot_bend():
    """Each way a policy (or an odd server) could turn the environment's silence into pay earns the floor."""
    from sandboxes.openenv import OpenEnvFault

    assert score([step(0.7), step(0.0)]) == (0.0, "the last observation's reward (2 steps)")  # 0 is a reward
    assert score([step(True)])[0] == 1.0  # OpenEnv allows a bool reward
    for odd in (None, float("nan"), float("inf"), 1e300, "1.0", [1]):
        assert score([step(0.9), step(odd)])[0] == -5.0, odd  # the last reward missing: not 0, not the 0.9 before
    assert score([step(0.9), step(None)], reward="sum")[0] == 0.9  # sum: what was given
    assert score([step(None)], reward="sum")[0] == -5.0
    # The server dying or stalling on the agent's action ends the episode at the floor, whatever came before.
    reward, detail = score([step(3.0), OpenEnvFault("openenv (step): the server exited")])
    assert reward == -5.0 and "failed on the agent's action" in detail
    # require_done: a good step then no verdict (the turn limit, malformed calls) is not paid.
    assert score([step(3.0)], require_done=True)[0] == -5.0
    assert score([step(3.0), step(-20.0, done=True)], require_done=True)[0] == -20.0
