"""(issue 51) An unmodified agent program plays the calc task inside the sandbox, through a real Celery worker:
its model calls reach only its episode's gateway (the bridge's port on the sandbox's own loopback), the
stored turns are exactly what the scripted policy served, the code_repo graders grade the final state in a
fresh sandbox, and a trainer step runs on the stored episodes. Then the hostile programs: one that never
calls the model, one that floods it, one that never exits, one that reaches for the network and plants a
reward: each ends as its own outcome, never as a fault.

The program here is a plain command (`python3 -c AGENT`): a minimal agent in the standard library that keeps
its whole history, as mini-swe-agent's text-based mode does (one ```bash block per reply, the command's
output as the next user message)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session
from transformers import AutoModelForCausalLM

from core.models import Episode, EpisodeGroup, Turn
from core.schemas.episode import ProgramRecord
from environments.agent_program.images import MINI_SWE_AGENT, program_image
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.policy.scripted import Samples
from tests.factories import pending_group, task
from tests.support.episode_fixtures import wait_ended
from tests.support.programs import program_spec
from trainer.advantages import assign_advantages, shaped_reward
from trainer.config import LossConfig, TrainerConfig
from trainer.engine import TorchEngine
from trainer.rollouts import load_groups
from trainer.step import update

# Runs a worker whose reaper sweeps every crucible container on the machine.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]

FIX = ["[sample:0] ```bash\ncat calc.py\n```", "```bash\nsed -i 's/a - b/a + b/' calc.py\n```",
       "```bash\npython3 -m pytest -q tests\n```", "```bash\nexit\n```"]
WRONG = ["[sample:1] ```bash\ncat calc.py\n```", "I will look first.", "```bash\nsed -i 's/a - b/a * b/' calc.py\n```",
         "```bash\nexit\n```"]


def bash(command: str) -> str:
    return f"```bash\n{command}\n```"


def play(session: Session, worker, *, image: str, payload: dict, script: str, size: int = 1, **program: object
         ) -> tuple[EpisodeGroup, list[Episode]]:
    env, _ = register_environment(session, spec=parse_spec(program_spec(image, f"prog-{script}", **program)))
    the_task = task(session, env, external_id=f"calc-{script}", instruction=f"Fix add(). [script:{script}]",
                    payload=json.loads(json.dumps(payload)))
    group, ids = pending_group(session, env=env, the_task=the_task, size=size, name=f"run-{script}")
    session.commit()
    for episode_id in ids:
        worker.send_task("crucible.run_episode", args=[episode_id], queue="agent_program")
    return group, [wait_ended(session, episode_id, timeout=300) for episode_id in ids]


def _turns(session: Session, episode: Episode) -> list[Turn]:
    return list(session.execute(select(Turn).where(Turn.run_id == episode.run_id, Turn.episode_id == episode.id)
                                .order_by(Turn.index)).scalars())


def test_an_agent_program_fixes_the_task_a_wrong_fix_earns_the_wrong_fix_reward_and_a_trainer_step_runs(
    db_session: Session, scripted, celery_worker, code_repo_image, calc_payload, wrong_fix_reward, tiny_model_dir,
) -> None:
    policy, _ = scripted
    policy.scripts["prog"] = Samples([FIX, WRONG])
    group, episodes = play(db_session, celery_worker, image=code_repo_image, payload=calc_payload, script="prog",
                           size=2)
    assert [(e.status, e.termination_reason) for e in episodes] == [("completed", "program_exited")] * 2, \
        [(e.failures, e.program) for e in episodes]
    assert sorted(e.reward for e in episodes) == pytest.approx([wrong_fix_reward, 1.0])
    served = {tuple(prompt + completion) for prompt, completion in policy.served}
    for episode in episodes:
        program = ProgramRecord.model_validate(episode.program)
        assert (program.exit_status, program.stopped, program.segments, program.refused) == (0, None, 1, 0)
        turns = _turns(db_session, episode)
        assert program.calls == len(turns) == episode.num_turns == 4
        # Exactly what was served: each turn's stream so far is a prompt the policy saw plus what it sampled.
        stream: list[int] = []
        for turn in turns:
            stream += turn.token_ids
            assert tuple(stream) in served
            assert turn.segment == 0 and turn.weight_version == 0 and turn.tool_call is None
            assert turn.loss_mask == [0] * turn.prompt_length + [1] * (len(turn.token_ids) - turn.prompt_length)
    wrong = next(e for e in episodes if e.reward < 1.0)
    assert wrong.turns_without_tool_call == 1  # "I will look first." holds no ```bash block
    _train_one_step(db_session, group, tiny_model_dir)


def _train_one_step(session: Session, group: EpisodeGroup, tiny_model_dir: Path) -> None:
    """A trainer step on a stored group whose two samples differ: each sequence it holds trained once."""
    groups = load_groups(session, [session.get(EpisodeGroup, group.id)])
    samples = groups[0].samples
    for sample in samples:
        sample.score = shaped_reward(sample, loss=LossConfig())
    assign_advantages(groups, scale_by_std=True)
    assert sorted(s.advantage > 0 for s in samples) == [False, True]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    config = TrainerConfig.model_validate({"optimizer": {"lr": 1e-3}})
    result = update(TorchEngine(model=model, config=config), samples, config=config)
    assert torch.isfinite(torch.tensor(result.loss))
    assert result.tokens_processed == sum(len(s.token_ids) for s in samples)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


SILENT = "import sys; print('no model for me'); sys.exit(3)"
FLOOD = r'''
import json, os, urllib.error, urllib.request
body = json.dumps({"messages": [{"role": "user", "content": "again [script:flood]"}]}).encode()
while True:
    try:
        urllib.request.urlopen(urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                                      headers={"Content-Type": "application/json"}), timeout=600).read()
    except urllib.error.HTTPError:
        pass
'''
STUCK = "import subprocess, time; subprocess.Popen(['setsid', 'sleep', '100000']); time.sleep(100000)"


@pytest.mark.parametrize(("name", "source", "program", "expected"), [
    ("silent", SILENT, {}, {"termination": "program_exited", "exit_status": 3, "stopped": None, "calls": 0}),
    ("flood", FLOOD, {"max_calls": 3}, {"termination": "max_turns", "exit_status": -9, "stopped": "max_calls",
                                        "calls": 3}),
    ("stuck", STUCK, {"timeout_s": 5}, {"termination": "episode_timeout", "exit_status": -9, "stopped": "timeout",
                                        "calls": 0}),
])
def test_a_hostile_program_ends_as_its_own_outcome_never_a_fault(
    db_session: Session, scripted, celery_worker, code_repo_image, calc_payload, wrong_fix_reward,
    name: str, source: str, program: dict, expected: dict,
) -> None:
    policy, _ = scripted
    policy.scripts[name] = [bash("true")] * 20
    _, (episode,) = play(db_session, celery_worker, image=code_repo_image, payload=calc_payload, script=name,
                         command=["python3", "-c", source], **program)
    record = ProgramRecord.model_validate(episode.program)
    assert (episode.status, episode.termination_reason, record.exit_status, record.stopped, record.calls) == (
        "completed", expected["termination"], expected["exit_status"], expected["stopped"], expected["calls"]), \
        (episode.failures, record)
    assert episode.num_turns == expected["calls"] and episode.attempts == 1
    assert episode.reward is not None and episode.reward <= wrong_fix_reward + 1e-9  # add() still subtracts


ESCAPE = r'''
import json, os, socket, sys, urllib.request
def attempt(what, action):
    try:
        action()
        print(what, "REACHED")
    except Exception as error:
        print(what, "refused:", type(error).__name__)
def connect(host, port):
    socket.create_connection((host, port), timeout=3).close()
attempt("docker host", lambda: connect("172.17.0.1", 2375))
attempt("a bridge address", lambda: connect("10.77.0.1", 8080))
attempt("the API on the host", lambda: connect("192.168.0.1", 8080))
attempt("dns", lambda: socket.getaddrinfo("pypi.org", 443))
attempt("the control dir", lambda: open("/run/crucible/planted", "w").write("x"))
attempt("the keeper dir", lambda: open("/run/crucible-keeper/planted", "w").write("x"))
# Plant a passing hidden test and a reward file for the grader; rewrite the public test to pass.
open("test_hidden.py", "w").write("def test_add():\n    assert True\n")
open(".crucible_reward", "w").write("1.0")
open("tests/test_calc.py", "w").write("def test_mul():\n    assert True\n")
# Requests the bridge must refuse and live on: a Content-Length int() cannot read, a body that is not UTF-8.
port = int(os.environ["OPENAI_BASE_URL"].rsplit(":", 1)[1].split("/")[0])
def raw(data):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(data)
        return conn.recv(100).split(b"\r\n")[0].decode()
print("odd length:", raw("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: \u00b2\r\n\r\n".encode()))
print("not utf-8:", raw(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n\xff\xfe"))
# Its own gateway answers; no header or path names another episode's.
body = json.dumps({"messages": [{"role": "user", "content": "episode 1 please [script:escape]"}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "X-Crucible-Episode": "1"})
print("gateway", json.load(urllib.request.urlopen(request, timeout=600))["model"])
'''


def test_a_program_reaches_nothing_but_its_own_gateway_and_cannot_plant_its_reward(
    db_session: Session, scripted, celery_worker, code_repo_image, calc_payload, wrong_fix_reward,
) -> None:
    policy, _ = scripted
    policy.scripts["escape"] = [bash("true")]
    _, (episode,) = play(db_session, celery_worker, image=code_repo_image, payload=calc_payload, script="escape",
                         command=["python3", "-c", ESCAPE])
    record = ProgramRecord.model_validate(episode.program)
    output = record.output
    print(output)  # what the program saw of each attempt (`-rP` shows it)
    assert (episode.status, episode.termination_reason, record.exit_status) == (
        "completed", "program_exited", 0), (episode.failures, record)
    for what in ("docker host", "a bridge address", "the API on the host", "dns", "the control dir", "the keeper dir"):
        assert f"{what} refused:" in output, output
    assert "REACHED" not in output and "gateway policy" in output
    assert "odd length: HTTP/1.1 400" in output and "not utf-8: HTTP/1.1 400" in output  # and it served on
    assert record.calls == 1 == episode.num_turns
    # The hidden tests ran in a fresh sandbox from the task's own copy: planted files changed nothing.
    assert episode.reward_components.get("hidden_tests", 0.0) == 0.0
    assert episode.reward is not None and episode.reward < wrong_fix_reward + 1e-9


def msa(command: str, thought: str = "THOUGHT: next.") -> str:
    return f"{thought}\n\n```mswea_bash_command\n{command}\n```"


MSA_FIX = [msa("cat calc.py", "[sample:0] THOUGHT: read it first."), msa("sed -i 's/a - b/a + b/' calc.py"),
           msa("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]


def _once_without_an_action(replied: list[str]):
    def step(_: str) -> str:
        """A reply without mini-swe-agent's action block, once. mini-swe-agent answers a format error by
        dropping that reply from its history: the next call sees the same turn again, and gets the fix."""
        if not replied:
            replied.append("no action")
            return "THOUGHT: no command this time."
        return msa("sed -i 's/a - b/a * b/' calc.py")
    return step


@pytest.fixture(scope="module")
def mini_swe_agent_image(code_repo_image: str) -> str:
    return program_image("mini-swe-agent", base_tag=code_repo_image)


@pytest.mark.slow  # minutes: its image's wheels from PyPI, then mini-swe-agent's start-up per episode (`make test-all`)
def test_mini_swe_agent_from_pypi_fixes_the_task_and_a_wrong_fix_earns_the_wrong_fix_reward(
    db_session: Session, scripted, celery_worker, mini_swe_agent_image, calc_payload, wrong_fix_reward, tiny_model_dir,
) -> None:
    """mini-swe-agent 2.4.6, unmodified, in its text-based mode (environments/agent_program/images.py): its
    litellm calls reach the episode's gateway; its own format error (a reply without its action block) is a
    turn without an action; the graders see only the repository it left."""
    policy, _ = scripted
    wrong = [msa("cat calc.py", "[sample:1] THOUGHT: read it first."), _once_without_an_action([]),
             msa("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]
    policy.scripts["msa"] = Samples([MSA_FIX, wrong])
    group, episodes = play(db_session, celery_worker, image=mini_swe_agent_image, payload=calc_payload, script="msa",
                       size=2, **{**MINI_SWE_AGENT, "max_calls": 8})
    records = [ProgramRecord.model_validate(e.program) for e in episodes]
    assert [(e.status, e.termination_reason) for e in episodes] == [("completed", "program_exited")] * 2, \
        [(e.failures, r.output[-2000:]) for e, r in zip(episodes, records, strict=True)]
    by_reward = sorted(zip(episodes, records, strict=True), key=lambda pair: pair[0].reward)
    (wrong, wrong_record), (right, right_record) = by_reward
    assert (right.reward, wrong.reward) == (pytest.approx(1.0), pytest.approx(wrong_fix_reward)), \
        [(e.reward_components, e.flags, e.final_diff, e.verifier_layers) for e in (right, wrong)]
    assert (right_record.calls, right_record.exit_status, right_record.segments, right.turns_without_tool_call) == (
        3, 0, 1, 0)
    # Its format error rewrote its context (the reply dropped): the call after it starts a second segment.
    assert (wrong_record.calls, wrong_record.exit_status, wrong_record.segments, wrong.turns_without_tool_call) == (
        4, 0, 2, 1)
    served = {tuple(prompt + completion) for prompt, completion in policy.served}
    for episode in (right, wrong):
        streams: dict[int, list[int]] = {}
        for turn in _turns(db_session, episode):  # each segment's stream so far: a prompt served, then its sample
            streams.setdefault(turn.segment, []).extend(turn.token_ids)
            assert tuple(streams[turn.segment]) in served
            assert turn.weight_version == 0
    _train_one_step(db_session, group, tiny_model_dir)  # the wrong fix's two segments are two sequences
