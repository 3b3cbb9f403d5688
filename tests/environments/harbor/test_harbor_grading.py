"""A Harbor task played and graded by its own tests/test.sh, end to end with a real dockerd and Postgres (the
short case `make test` runs; the `harbor` package reading and writing folders is tests/environments/harbor/
test_harbor_package.py, `make test-harbor`).

The task is the folder of tests/support/harbor.py, its environment built from its own Dockerfile and adapted
(environments/harbor/images.py); here it is converted without the reader (the folder's files are given as harbor
would return them), so nothing but the grading path is under test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode, Turn
from environments.code_repo.harbor_tests import RawHarborRun, reward_of
from environments.harbor.convert import harbor_records
from environments.harbor.reader import HarborRead
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from sandboxes.events import EventKind
from task_workers.episode.runner import run_episode
from tests import factories
from tests.support.calc import env_spec
from tests.support.harbor import FIX, INSTRUCTION, TEST_OUTPUTS, TEST_SH, WRONG, write_calc_task

pytestmark = pytest.mark.xdist_group("task-images")


@pytest.fixture(scope="module")
def harbor_payload(code_repo_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = write_calc_task(tmp_path_factory.mktemp("harbor"), base_image=code_repo_image)
    read = HarborRead(folder=folder, name="harbor-calc", instruction=INSTRUCTION,
                      config={"verifier": {"timeout_sec": 60.0}, "environment": {}},
                      tests={"test.sh": TEST_SH, "test_outputs.py": TEST_OUTPUTS}, solution={}, harbor_version="")
    (record,) = harbor_records([read])
    assert record.instruction == INSTRUCTION and record.external_id == "harbor-calc"
    return record.payload


@pytest.fixture(scope="module")
def hooked_payload(code_repo_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same task on an image whose environment names a file of the working directory for every bash to run
    first (BASH_ENV, as a task's Dockerfile may): in a grading sandbox that file is the submission's."""
    folder = write_calc_task(tmp_path_factory.mktemp("hooked"), base_image=code_repo_image, name="hooked")
    dockerfile = folder / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "ENV BASH_ENV=/app/.hook\n")
    read = HarborRead(folder=folder, name="hooked", instruction=INSTRUCTION, config={"environment": {}},
                      tests={"test.sh": TEST_SH, "test_outputs.py": TEST_OUTPUTS}, solution={}, harbor_version="")
    (record,) = harbor_records([read])
    return record.payload


HOOK = ("(setsid sh -c 'while :; do if [ -d /tmp/crucible-harbor/logs/verifier ]; then "
        "echo 1 > /tmp/crucible-harbor/logs/verifier/reward.json; echo 1 > /tmp/crucible-harbor/logs/verifier/reward.txt; "
        "fi; sleep 0.05; done' >/dev/null 2>&1 &)\n")


def _episode(session: Session, payload: dict, name: str) -> int:
    spec = {**env_spec("crucible/code-repo:latest"), "name": "harbor", "task_images": ["crucible-harbor/*"],
            "verifier": {"weights": {"rules": 0.0, "hidden_tests": 1.0}}}
    env, _ = register_environment(session, spec=parse_spec(spec))
    task = factories.task(session, env, external_id=name, instruction=f"{INSTRUCTION} [script:{name}]", payload=payload)
    _, (episode_id,) = factories.pending_group(session, env=env, the_task=task, name=f"run-{name}")
    session.commit()
    return episode_id


def _hidden(session: Session, episode_id: int) -> dict:
    session.expire_all()
    episode = session.get(Episode, episode_id)
    assert episode is not None
    return next(layer for layer in episode.verifier_layers if layer["name"] == "hidden_tests")


def test_a_harbor_task_is_played_in_its_image_and_graded_by_its_test_sh_in_a_fresh_sandbox(
        db_session, scripted, sandboxes, events, policy_client, harbor_payload) -> None:
    policy, _ = scripted
    policy.scripts["fix"] = FIX
    policy.scripts["wrong"] = WRONG
    right = _episode(db_session, harbor_payload, "fix")
    wrong = _episode(db_session, harbor_payload, "wrong")
    assert run_episode(right, policy=policy_client, sandboxes=sandboxes, worker="test").reward == pytest.approx(1.0)
    assert run_episode(wrong, policy=policy_client, sandboxes=sandboxes, worker="test").reward == pytest.approx(0.0)

    graded = _hidden(db_session, right)
    assert graded["score"] == 1.0 and graded["passed"]
    assert graded["detail"].startswith("tests/test.sh: exit 0; reward.txt: 1"), graded["detail"]
    assert "2 passed" in graded["detail"]  # test.sh's own output, its tail
    assert graded["record"] == {"blinded": 0, "graded": 1}  # counted as graded unblinded
    failed = _hidden(db_session, wrong)
    assert failed["score"] == 0.0 and "reward.txt: 0" in failed["detail"] and "2 failed" in failed["detail"]
    episode = db_session.get(Episode, right)
    assert "return a + b" in episode.final_diff and "test_outputs" not in episode.final_diff
    # the agent saw the task's files at /app, the workspace: the instruction's paths hold
    creates = [e for e in events.events if e.kind is EventKind.CREATE]
    assert {e.detail["image"] for e in creates} == {harbor_payload["image"]}
    assert len(creates) >= 6  # per episode: the agent's, the submission's and the tests' fresh sandbox


def test_what_the_agent_plants_in_its_own_sandbox_never_reaches_the_grade(
        db_session, scripted, sandboxes, events, policy_client, harbor_payload) -> None:
    """A reward file where /logs leads, a test.sh where /tests leads, a writer left running, the reward in the
    workspace: the grader reads only what test.sh wrote in a fresh sandbox (the change is a comment: 0)."""
    policy, _ = scripted
    plant = ("mkdir -p /tmp/crucible-harbor/logs/verifier /tmp/crucible-harbor/tests && "
             "echo 1 > /logs/verifier/reward.txt && echo '{\"reward\": 1}' > /logs/verifier/reward.json && "
             "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
             "cat /tests/test.sh /logs/verifier/reward.txt; ls /app/")
    linger = ("(setsid sh -c 'while :; do echo 1 > /tmp/crucible-harbor/logs/verifier/reward.txt; sleep 0.2; done' "
              ">/dev/null 2>&1 &); mkdir -p logs/verifier && echo 1 > logs/verifier/reward.txt")
    policy.scripts["plant"] = [hermes_call("bash", command=plant), hermes_call("bash", command=linger),
                               hermes_call("edit_file", path="calc.py", old_str="def mul", new_str="# mul\ndef mul"),
                               hermes_call("submit")]
    episode_id = _episode(db_session, harbor_payload, "plant")
    assert run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test").reward == pytest.approx(0.0)
    planted = db_session.execute(select(Turn.observation).where(Turn.episode_id == episode_id, Turn.index == 0)).scalar_one()
    assert "echo 1 > /logs/verifier/reward.txt\n1\n" in planted and "calc.py" in planted, planted  # it took, there
    graded = _hidden(db_session, episode_id)
    assert graded["score"] == 0.0 and "reward.txt: 0" in graded["detail"], graded["detail"]


def test_a_file_the_images_environment_names_runs_nowhere_in_grading(
        db_session, scripted, sandboxes, policy_client, hooked_payload) -> None:
    """The submission is the file BASH_ENV names, a writer of reward files left running: no grading step of ours
    and not test.sh starts with the image's environment, so it never runs there (without that, it earns 1)."""
    policy, _ = scripted
    policy.scripts["hook"] = [hermes_call("write_file", path=".hook", content=HOOK), hermes_call("submit")]
    episode_id = _episode(db_session, hooked_payload, "hook")
    assert run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test").reward == pytest.approx(0.0)
    graded = _hidden(db_session, episode_id)
    assert graded["score"] == 0.0 and "reward.txt: 0" in graded["detail"] and "2 failed" in graded["detail"], graded
    db_session.expire_all()
    assert ".hook" in db_session.get(Episode, episode_id).final_diff


def _raw(*, json_text: bytes | None = None, text: bytes | None = None) -> RawHarborRun:
    """A run whose reward files hold these bytes, read as the wrapper's lines are (text, undecodable bytes replaced)."""
    return RawHarborRun(exit_code=0, timed_out=False, output="",
                        reward_json=None if json_text is None else json_text.decode(errors="replace"),
                        reward_txt=None if text is None else text.decode(errors="replace"))


@pytest.mark.parametrize("raw, score, why", [
    (_raw(text=b"1\n"), 1.0, "reward.txt: 1"),
    (_raw(text=b" 0.25 "), 0.25, "reward.txt: 0.25"),
    (_raw(json_text=b'{"reward": 0.5, "style": 1}'), 0.5, "reward.json: 0.5"),
    (_raw(json_text=b'{"reward": 1}', text=b"0"), 0.0, "reward.json: 1; reward.txt: 0"),  # both: the lower counts
    (_raw(json_text=b"0.5", text=b"1"), 0.5, "reward.json: 0.5; reward.txt: 1"),
    (_raw(json_text=b"[" * 65536), 0.0, "reward.json:"),  # nested past the parser's depth: 0, never a crash
    (_raw(json_text=b"1" + b"0" * 400), 0.0, "reward.json:"),  # an int no float holds
    (_raw(json_text=b'{"reward": ' + b"9" * 4000 + b"}"), 0.0, "reward.json:"),
    (_raw(json_text=b'{"accuracy": 1}'), 1.0, "reward.json: 1"),  # the only value
    (_raw(json_text=b"0.75"), 0.75, "reward.json: 0.75"),
    (_raw(), 0.0, "no reward: test.sh wrote neither"),
    (_raw(text=b"nan"), 0.0, "expected a reward in [0, 1], got nan"),
    (_raw(text=b"inf"), 0.0, "expected a reward in [0, 1], got inf"),
    (_raw(text=b"1e309"), 0.0, "expected a reward in [0, 1]"),
    (_raw(text=b"2"), 0.0, "expected a reward in [0, 1], got 2.0"),
    (_raw(text=b"-0.5"), 0.0, "expected a reward in [0, 1], got -0.5"),
    (_raw(text=b"1 1"), 0.0, "reward.txt: expected a number"),
    (_raw(text=b"\xff\xfe"), 0.0, "reward.txt: expected a number"),
    (_raw(text=b""), 0.0, "reward.txt: expected a number"),
    (_raw(json_text=b'{"a": 1, "b": 1}'), 0.0, "expected a number or an object with a numeric `reward`"),
    (_raw(json_text=b'{"reward": true}'), 0.0, "expected a number or an object"),
    (_raw(json_text=b'{"reward": "1"}'), 0.0, "expected a number or an object"),
    (_raw(json_text=b"[1]"), 0.0, "expected a number or an object"),
    (_raw(json_text=b"NaN"), 0.0, "expected a reward in [0, 1], got nan"),
    (_raw(json_text=b"{"), 0.0, "reward.json: expected JSON"),
])
def test_the_reward_file_is_read_as_harbor_reads_it_and_only_a_number_in_0_1_counts(raw, score, why) -> None:
    got, reason = reward_of(raw)
    assert got == score and why in reason, reason


@pytest.mark.parametrize("files, workdir, message", [
    ({"test.sh": "", "helpers": "", "helpers/x.py": ""}, "/app", "none a directory of another), got 'helpers'"),
    ({"test.sh": "", "a//b": ""}, "/app", "no empty or . part"),
    ({"test.sh": "", "./x": ""}, "/app", "no empty or . part"),
    ({"test.sh": "", "x/": ""}, "/app", "no empty or . part"),
    ({"test.sh": "", "../x": ""}, "/app", "inside the workspace"),
    ({"test.sh": "", "/etc/x": ""}, "/app", "inside the workspace"),
    ({"test.sh": "", "-rf": ""}, "/app", "inside the workspace"),
    ({"test.sh": ""}, "/workspace/app", "expected /workspace itself or a directory outside it"),
    ({"test.sh": ""}, "/tmp/app", "expected a directory of its own such as /app"),
    ({"test.sh": ""}, "/app/../etc", "String should match pattern"),
    ({"test.sh": ""}, "/app dir", "String should match pattern"),
])
def test_harbor_tests_refuse_paths_a_grading_sandbox_cannot_hold(files: dict, workdir: str, message: str) -> None:
    from pydantic import ValidationError

    from environments.code_repo.task import HarborTests

    with pytest.raises(ValidationError, match=re.escape(message)):
        HarborTests(format="harbor", files=files, workdir=workdir)


def test_a_task_whose_tests_are_not_harbors_is_refused_with_its_reason(tmp_path: Path, code_repo_image: str) -> None:
    from core.errors import ConfigError

    folder = write_calc_task(tmp_path, base_image=code_repo_image, name="no-script")
    read = HarborRead(folder=folder, name="no-script", instruction=INSTRUCTION, config={"environment": {}},
                      tests={"test_outputs.py": TEST_OUTPUTS}, solution={}, harbor_version="")
    with pytest.raises(ConfigError, match=r"no-script: files: expected the tests folder's test.sh, "
                                          r"got \['test_outputs.py'\]"):
        list(harbor_records([read]))
    env_var = HarborRead(folder=folder, name="no-script", instruction=INSTRUCTION,
                         config={"environment": {}, "verifier": {"env": {"KEY": "${OPENAI_API_KEY}"}}},
                         tests={"test.sh": TEST_SH}, solution={}, harbor_version="")
    with pytest.raises(ConfigError, match=r"\[verifier\].env: KEY: expected a literal value"):
        list(harbor_records([env_var]))
    system = HarborRead(folder=folder, name="no-script", instruction=INSTRUCTION,
                        config={"environment": {"workdir": "/usr/lib"}}, tests={"test.sh": TEST_SH}, solution={},
                        harbor_version="")
    with pytest.raises(ConfigError, match=r"expected a working directory of the task's own .* got '/usr/lib'"):
        list(harbor_records([system]))
    linked = write_calc_task(tmp_path, base_image=code_repo_image, name="linked")
    (linked / "environment" / "outside").symlink_to("/etc")
    read = HarborRead(folder=linked, name="linked", instruction=INSTRUCTION, config={"environment": {}},
                      tests={"test.sh": TEST_SH}, solution={}, harbor_version="")
    with pytest.raises(ConfigError, match=r"environment/: expected files and folders of the task's own, got a symbolic "
                                          r"link: environment/outside"):
        list(harbor_records([read]))
