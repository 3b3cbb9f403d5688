"""`crucible tasks calibrate` against a scripted policy of known skill per task, through the CLI in a
subprocess: the episode runner plays every episode in a Docker sandbox with the read_number grader, and
each task's pass rate and bucket are what the policy's skill on it says.

The policy reads the file, then submits what it read for an `always` task, a wrong number for a `never`
task, and alternately right and wrong for a `half` task: with 4 samples a task, pass rates 1, 0 and 0.5,
buckets easy, hard and medium, whatever order the episodes run in."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from controller.leader import LeaderLock
from core.models import Run, Task
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from sandboxes import labels as L
from task_workers.policy.scripted import ScriptedPolicy, serve
from tests import factories

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"name": "calibrate-read-number", "kind": "read_number", "image": "code-repo",
        "sandbox": {"memory": "256m", "pids": 64, "workspace_size": "16m", "tmp_size": "16m", "max_lifetime_s": 600},
        "limits": {"max_turns": 3, "episode_timeout_s": 60, "tool_timeout_s": 5, "max_tool_errors": 2},
        "verifier": {"weights": {"answer": 1.0}}}
SKILL = {"4821": "always", "1736": "always", "9054": "half", "3377": "half", "2210": "never", "6119": "never"}
EXPECTED = {"always": (1.0, "easy"), "half": (0.5, "medium"), "never": (0.0, "hard")}
SAMPLES = 4


class KnownSkill:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tries: Counter[str] = Counter()

    def answer(self, prompt: str) -> str:
        read = [n for n in SKILL if re.search(rf"\b{n}\b", prompt)]
        assert len(read) == 1, "the policy should have read exactly one number"
        number = read[0]
        with self.lock:
            self.tries[number] += 1
            attempt = self.tries[number]
        right = SKILL[number] == "always" or (SKILL[number] == "half" and attempt % 2 == 0)
        return hermes_call("submit", answer=number if right else str(int(number) + 1))


def _crucible(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "COLUMNS": "250"})


def test_calibration_gives_each_task_the_pass_rate_and_bucket_of_a_policy_of_known_skill(  # type: ignore[no-untyped-def]
        db_session: Session, engine: Engine, backend) -> None:
    env, _ = register_environment(db_session, spec=parse_spec(SPEC))
    for number in SKILL:
        factories.task(db_session, env, split="train", external_id=f"n-{number}",
                       instruction="The file number.txt holds a number. Read it and submit it. [script:skill]",
                       payload={"path": "number.txt", "number": number})
    factories.task(db_session, env, split="test", external_id="held-out", instruction="[script:skill]",
                   payload={"path": "number.txt", "number": "1111"})  # another split: never played
    db_session.commit()
    skill = KnownSkill()
    policy = ScriptedPolicy({"skill": [hermes_call("bash", command="cat number.txt"), skill.answer]})
    with serve(policy) as url:
        done = _crucible("tasks", "calibrate", env.name, "--policy", url, "--samples", str(SAMPLES), "-o", "json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["buckets"] == {"easy": 2, "medium": 2, "hard": 2}
    assert sum(skill.tries.values()) == len(SKILL) * SAMPLES
    db_session.expire_all()
    for task in db_session.execute(select(Task).where(Task.environment_name == env.name)).scalars():
        if task.split == "test":
            assert task.pass_rate is None and task.difficulty is None
            continue
        rate, bucket = EXPECTED[SKILL[task.external_id.removeprefix("n-")]]
        assert (task.pass_rate, task.pass_rate_samples, task.difficulty) == (rate, SAMPLES, bucket), task.external_id
    run = db_session.get(Run, report["run_id"])
    assert run is not None and (run.purpose, run.status) == ("pass_rate", "completed")
    assert backend.list(labels={L.WORKER: "calibrate"}) == []  # every sandbox given back (no other calibration runs)


def test_calibration_refuses_in_one_line_what_it_cannot_use(db_session: Session, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    env, _ = register_environment(db_session, spec=parse_spec({**SPEC, "name": "calibrate-refusals"}))
    factories.task(db_session, env, split="train", external_id="n-1", instruction="[script:skill]",
                   payload={"path": "number.txt", "number": "1"})
    db_session.commit()
    cases = [
        (["--policy", "ftp://127.0.0.1/v1"], "--policy: expected an http(s) URL"),
        (["--policy", "http://127.0.0.1:9/v1"], "--policy: expected a policy server answering GET"),
        (["--policy", "http://127.0.0.1:9/v1", "--split", "\n"], "split: expected a name"),
    ]
    for extra, expected in cases:
        done = _crucible("tasks", "calibrate", env.name, *extra)
        assert done.returncode != 0 and done.stderr.count("\n") == 1 and expected in done.stderr, (extra, done.stderr)
    policy = ScriptedPolicy({})
    with serve(policy) as url:
        done = _crucible("tasks", "calibrate", "no-such-environment", "--policy", url)
        assert done.returncode != 0 and "no-such-environment" in done.stderr and done.stderr.count("\n") == 1, done.stderr
        lock = LeaderLock(engine, name="a-running-controller")
        assert lock.acquire()
        try:
            done = _crucible("tasks", "calibrate", env.name, "--policy", url)
        finally:
            lock.release()
    assert done.returncode != 0 and "a controller is running" in done.stderr, done.stderr
    assert db_session.scalar(select(Run.id).where(Run.purpose == "pass_rate", Run.name.like("%calibrate-refusals%"))) is None
