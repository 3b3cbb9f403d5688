"""`crucible eval` against a scripted policy of known skill, through the real pieces: the controller
dispatches the eval run (one group of k per held-out task), the real episode runner plays every episode
in a Docker sandbox with the read_number grader, and the report's pass@1 and pass@k are what the policy's
skill says, each inside its 95 % interval.

The policy reads the file, then submits what it read when the number is even, and a wrong number when it
is odd: its true success rate on a split is the share of even numbers there, known before it plays."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api.services.run_eval import eval_report
from cli.evals import show
from controller.config import ControllerConfig
from controller.dispatcher import RecordingDispatcher
from controller.evaluation import launch_eval
from controller.loop import Controller
from environments.parsing import hermes_call
from environments.sandboxes import DockerSandboxes
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.episode.runner import run_episode
from task_workers.policy.client import PolicyClient
from task_workers.policy.scripted import ScriptedPolicy, serve
from tests import factories

pytestmark = pytest.mark.docker

SPEC = {"name": "eval-read-number", "kind": "read_number", "image": "code-repo",
        "sandbox": {"memory": "256m", "pids": 64, "workspace_size": "16m", "tmp_size": "16m", "max_lifetime_s": 600},
        "limits": {"max_turns": 3, "episode_timeout_s": 60, "tool_timeout_s": 5, "max_tool_errors": 2},
        "verifier": {"weights": {"answer": 1.0}}}
NUMBERS = ["4821", "1736", "9054", "3377", "2210", "6119"]  # three even: a true pass@1 of 0.5
SAMPLES = 2


def _answer(prompt: str) -> str:
    """Submit what the file said when it is even; one more (wrong) when it is odd."""
    read = [n for n in NUMBERS if re.search(rf"\b{n}\b", prompt)]
    assert len(read) == 1, "the policy should have read exactly one number"
    number = int(read[0])
    return hermes_call("submit", answer=str(number if number % 2 == 0 else number + 1))


def test_the_report_matches_a_policy_of_known_skill(db_session: Session, engine: Engine,
                                                    sandboxes: DockerSandboxes) -> None:
    env, _ = register_environment(db_session, spec=parse_spec(SPEC))
    for index, number in enumerate(NUMBERS):
        factories.task(db_session, env, split="test", external_id=f"n-{number}",
                       instruction="The file number.txt holds a number. Read it and submit it. [script:skill]",
                       payload={"path": "number.txt", "number": number},
                       difficulty="easy" if index < 2 else None)
    factories.task(db_session, env, split="train", external_id="train-only", instruction="[script:skill]",
                   payload={"path": "number.txt", "number": "1111"})  # not in the held-out split: never played
    run = launch_eval(db_session, model="scripted", environment=env.name, samples_per_task=SAMPLES)
    db_session.commit()

    recorder = RecordingDispatcher()
    controller = Controller(engine=engine, dispatcher=recorder, settings=ControllerConfig(), name="eval-test")
    try:
        assert controller.step().dispatched == {run.id: len(NUMBERS)}
        assert len(recorder.episode_ids) == len(NUMBERS) * SAMPLES
        policy = ScriptedPolicy({"skill": [hermes_call("bash", command="cat number.txt"), _answer]})
        with serve(policy) as url:
            client = PolicyClient(base_url=url, retries=1, backoff_s=0.05)
            for episode_id in recorder.episode_ids:
                run_episode(episode_id, policy=client, sandboxes=sandboxes, worker="eval-test")
            client.close()
        assert controller.step().finished == [run.id]
    finally:
        controller.close()

    db_session.expire_all()
    report = eval_report(db_session, run_id=run.id)
    assert (report.purpose, report.status, report.k, report.split, report.unfinished) == ("eval", "completed", 2,
                                                                                           "test", 0)
    overall = report.overall
    assert (overall.tasks, overall.episodes, overall.solved, overall.excluded) == (6, 12, 6, 0)
    assert overall.pass_at_1 is not None and overall.pass_at_k is not None
    assert overall.pass_at_1.value == 0.5 and overall.pass_at_k.value == 0.5  # a deterministic skill: k adds nothing
    assert overall.pass_at_1.low < 0.5 < overall.pass_at_1.high
    assert overall.pass_at_1.low > 0.0 and overall.pass_at_1.high < 1.0  # six tasks: an interval, not a point
    assert list(report.by_environment) == [env.name]
    easy = report.by_bucket["easy"]  # 4821 (odd) and 1736 (even)
    assert (easy.tasks, easy.solved, easy.pass_at_1.value if easy.pass_at_1 else None) == (2, 2, 0.5)
    assert report.by_bucket["unknown"].tasks == 4


def test_the_cli_prints_the_report(db_session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    """The same report through `crucible eval show`, as a table and as JSON (no episode played yet)."""
    env, _ = register_environment(db_session, spec=parse_spec({**SPEC, "name": "eval-cli"}))
    factories.task(db_session, env, split="test", payload={"path": "number.txt", "number": "12"})
    run = launch_eval(db_session, model="scripted", environment=env.name, samples_per_task=3)
    db_session.commit()
    show(run.id, output="table")  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert f"run {run.id} (eval, pending)" in out and "pass@3 [95 %]" in out and "percentile bootstrap" in out
