"""Adding a kind is a folder plus one registry line (issue 49, item 1). A toy kind, `parrot`, is written here
into a folder of its own (a package on a temporary path) and registered with one line in
`environments.registry.KINDS`; nothing else changes. It then goes where every kind goes: its spec section
(validated by its own model, named after it, refused under another kind), its own rule on the spec, its
task lines (its example payload in an error, its default instruction) imported into the real Postgres, its
formats, and one episode through the real runner in a Docker sandbox with its `prepare` step. If any of
these needed another module to know the kind, this test fails: the module would not know `parrot`.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.errors import ConfigError
from core.models import Episode, Task
from environments import registry
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from environments.tasks import import_uploaded
from tests import factories
from tests.support.rewards import assert_reward_derived

KIND = textwrap.dedent('''
    """A toy kind: the agent says a word back, `say(word)`; the word is graded with the spec's suffix."""

    from __future__ import annotations

    import json
    from typing import Any

    from pydantic import BaseModel, ConfigDict, Field

    from environments.base import Kind, LayerResult, ToolResult, Verdict, tool_error

    PREPARED: list[str] = []
    TOOL = {"type": "function", "function": {"name": "say", "description": "Say the word.", "parameters": {
        "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}
    TOOL_SCHEMAS = {"say": TOOL}


    class ParrotSettings(BaseModel):
        model_config = ConfigDict(extra="forbid")

        suffix: str = Field(default="", max_length=8)


    class ParrotTask(BaseModel):
        model_config = ConfigDict(extra="forbid")

        word: str = Field(min_length=1, max_length=32, pattern="^[a-z]+$")


    class ParrotKind(Kind):
        name = "parrot"
        default_weights = {"said": 1.0}
        config_model = ParrotSettings
        formats = ("crucible",)
        example = '{"word": "hello"}'

        def __init__(self, spec: Any) -> None:
            self.spec = spec
            self.settings = spec.kind_config or ParrotSettings()

        @classmethod
        def check_spec(cls, spec: Any) -> None:
            if spec.limits.max_turns > 4:
                raise ValueError(f"limits.max_turns: expected at most 4 for kind parrot, got {spec.limits.max_turns}")

        @staticmethod
        def parse_task(payload: dict[str, Any]) -> ParrotTask:
            return ParrotTask.model_validate(payload)

        @staticmethod
        def default_instruction(task: ParrotTask) -> str:
            return f"Say {task.word}."

        @staticmethod
        def prepare(*, task: ParrotTask, open_image: Any) -> ParrotTask:
            PREPARED.append(task.word)
            return task

        def tools(self) -> list[dict[str, Any]]:
            return [TOOL]

        def system_prompt(self) -> str:
            return "Say the word."

        def setup(self, *, sandbox: Any, task: ParrotTask) -> None:
            sandbox.put_files({"/workspace/word.txt": task.word.encode()})

        def opening(self, *, sandbox: Any, task: ParrotTask, instruction: str) -> None:
            return None

        def execute(self, *, sandbox: Any, call: Any, task: ParrotTask) -> ToolResult:
            if call.name != "say":
                return tool_error(f"tool: expected say, got {json.dumps(call.name)}")
            return ToolResult(observation="said", exit_code=0, ends_episode=True)

        def verify(self, *, sandbox: Any, task: ParrotTask, submitted: bool, open_sandbox: Any,
                   actions: Any) -> Verdict:
            said = [call.arguments.get("word") for call in actions if call.name == "say"]
            written = sandbox.get_file("/workspace/word.txt").decode()  # the sandbox the kind set up
            right = bool(said) and said[-1] == written + self.settings.suffix
            return Verdict(layers=[LayerResult("said", 1.0 if right else 0.0, right, f"got {said[-1:]!r}")])
''')

SPEC = {"name": "parrot-env", "kind": "parrot", "image": "code-repo", "parrot": {"suffix": "s"},
        "sandbox": {"memory": "256m", "pids": 64, "workspace_size": "16m", "tmp_size": "16m", "max_lifetime_s": 600},
        "limits": {"max_turns": 2, "episode_timeout_s": 60, "tool_timeout_s": 5, "max_tool_errors": 2}}
SANDBOX_WORKER = "toy-kind-test"  # names this module's sandboxes (`module_sandboxes`: tests/support/sandbox_fixtures.py)


@pytest.fixture
def parrot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The toy kind's folder on a temporary path, and its one registry line."""
    folder = tmp_path / "parrot_kind"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "kind.py").write_text(KIND)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.KINDS, "parrot", "parrot_kind.kind:ParrotKind")
    import parrot_kind.kind

    yield parrot_kind.kind
    for name in ("parrot_kind.kind", "parrot_kind"):
        __import__("sys").modules.pop(name, None)


def test_a_toy_kind_is_a_folder_and_a_registry_line(parrot: object, db_session: Session) -> None:
    spec = parse_spec(SPEC)
    assert spec.kind_config.suffix == "s"  # type: ignore[union-attr]
    assert spec.model_dump(mode="json")["parrot"] == {"suffix": "s"}  # dumped as written, under its name
    assert parse_spec(spec.model_dump(mode="json")).content_hash() == spec.content_hash()
    refusals = {
        "parrot.suffix: String should have at most 8 characters": {**SPEC, "parrot": {"suffix": "x" * 9}},
        "parrot.volume: Extra inputs are not permitted": {**SPEC, "parrot": {"volume": 11}},
        "limits.max_turns: expected at most 4 for kind parrot, got 9": {**SPEC, "limits": {"max_turns": 9}},
        "parrot: expected this section only for kind parrot, got kind 'read_number'": {**SPEC, "kind": "read_number"},
        "browser: expected this section only for kind browser, got kind 'parrot'": {**SPEC, "browser": {}},
        "kind_config: expected the kind's section under the kind's own name": {**SPEC, "kind_config": {}},
    }
    for message, data in refusals.items():
        with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
            parse_spec(data)

    env, _ = register_environment(db_session, spec=spec)
    lines = [json.dumps({"id": "p-1", "payload": {"word": "cat"}}),
             json.dumps({"id": "p-2", "instruction": "Repeat after me: dog.", "split": "test",
                         "payload": {"word": "dog"}})]
    assert import_uploaded(db_session, environment=env.name, lines=lines) == 2
    stored = {task.external_id: task for task in db_session.execute(
        select(Task).where(Task.environment_name == env.name)).scalars()}
    assert stored["p-1"].instruction == "Say cat." and stored["p-1"].payload == {"word": "cat"}
    assert stored["p-2"].split == "test"
    with pytest.raises(ConfigError, match=r':1: payload: expected a parrot task object like \{"word": "hello"\}'):
        import_uploaded(db_session, environment=env.name, lines=[json.dumps({"id": "p-3", "payload": "cat"})])
    with pytest.raises(ConfigError, match=r":1: payload\.word: String should match pattern"):
        import_uploaded(db_session, environment=env.name, lines=[json.dumps({"id": "p-3", "payload": {"word": "Cat"}})])
    with pytest.raises(ConfigError, match="format: expected crucible for 'parrot-env'"):
        import_uploaded(db_session, environment=env.name, lines=lines, format="swebench")


@pytest.mark.docker
def test_a_toy_kind_plays_an_episode_through_the_real_runner(parrot: object, db_session: Session,
                                                              module_sandboxes: object) -> None:
    from task_workers.episode.runner import run_episode
    from task_workers.policy.client import PolicyClient
    from task_workers.policy.scripted import ScriptedPolicy, serve

    env, _ = register_environment(db_session, spec=parse_spec(SPEC))
    rewards = {}
    for word, said in (("cat", "cats"), ("dog", "dog")):
        task = factories.task(db_session, env, external_id=f"p-{word}", instruction=f"Say {word}. [script:{word}]",
                              payload={"word": word})
        episode_id = factories.pending_episode(db_session, env=env, the_task=task, run_name=f"parrot-{word}")
        with serve(ScriptedPolicy({word: [hermes_call("say", word=said)]})) as url:
            client = PolicyClient(base_url=url, retries=1, backoff_s=0.05)
            run_episode(episode_id, policy=client, sandboxes=module_sandboxes, worker="test")  # type: ignore[arg-type]
            client.close()
        db_session.expire_all()
        episode = db_session.get(Episode, episode_id)
        assert episode is not None and episode.termination_reason == "submitted", episode and episode.failures
        rewards[word] = (episode.reward, episode.reward_components)
        assert_reward_derived(db_session, [episode_id])
    assert rewards == {"cat": (1.0, {"said": 1.0}), "dog": (0.0, {"said": 0.0})}  # the suffix from its section
    assert parrot.PREPARED == ["cat", "dog"]  # type: ignore[attr-defined]
