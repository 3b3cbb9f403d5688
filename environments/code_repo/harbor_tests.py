"""A Harbor task's tests/test.sh as a graded layer (task.HarborTests).

    run = run_harbor_tests(fresh, spec)   # fresh: base + the submission loaded, nothing of the agent's run

Harbor's own verifier uploads tests/ into the container the agent used and runs `bash /tests/test.sh` there as
root; here the tests reach only a fresh grading sandbox holding base + the submitted diff (the agent's processes,
its files outside the workspace and whatever it planted in its own /tests or /logs never come along), and
test.sh runs as the agent's uid with an environment we build. The reward is read after every process of that uid
is dead, by root, from /logs/verifier (reward.json and reward.txt, the lower when both are there; links refused).

What it cannot claim: test.sh is the task's own program, and the code under test runs in its process tree as
the same uid, so the submission can write the reward file itself. The layer records itself as graded unblinded
(`record: {"blinded": 0, "graded": 1}`: the run's grading page counts it), and the code_repo monitors still read
the diff (flags as for any task)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from core.tar import pack_files
from environments.base import Sandbox
from environments.code_repo.grader import TestRun, _decode_log, _program
from environments.code_repo.repo import SetupError
from environments.code_repo.task import HarborTests

_PREPARE = _program("harbor_prepare.sh")
_RUN = _program("harbor_run.sh")
MAX_DETAIL = 3000


@dataclass(frozen=True)
class RawHarborRun:
    exit_code: int
    timed_out: bool
    output: str
    reward_json: str | None
    reward_txt: str | None
    stopped: bool = True
    """Every process of the tests' uid was killed before the reward files were read (else none was read)."""


def run_harbor_tests(sandbox: Sandbox, spec: HarborTests) -> TestRun:
    """Run `spec`'s test.sh in `sandbox` and grade the reward it wrote: a number in [0, 1] is the score; no
    reward file, one that does not parse or a number outside [0, 1] scores 0 with the reason."""
    raw = _run(sandbox, spec)
    score, why = reward_of(raw) if raw.stopped else \
        (0.0, "no reward read: processes of the tests outlived 200 passes of killing them")
    status = "timed out" if raw.timed_out else f"exit {raw.exit_code}"
    detail = f"tests/test.sh: {status}; {why}\n{raw.output[-MAX_DETAIL:]}".rstrip()
    return TestRun(score=score, passed=score == 1.0, detail=detail, blinded=0, graded=1)


def _run(sandbox: Sandbox, spec: HarborTests) -> RawHarborRun:
    files = {path: text.encode() for path, text in spec.files.items()}
    prepared = sandbox.exec(["bash", "-c", _PREPARE, "prepare"], as_control=True, timeout_s=60,
                            stdin=pack_files(files, uid=0, gid=0))
    if prepared.exit_code != 0:
        raise SetupError(f"harbor tests: expected to unpack tests/ in the grading sandbox, got exit "
                         f"{prepared.exit_code}: {bytes(prepared.stderr).decode(errors='replace')[-300:]}")
    limit = max(1, int(spec.timeout_s))
    pairs = [f"{name}={value}" for name, value in sorted(spec.env.items())]
    ran = sandbox.exec(["bash", "-c", _RUN, "run", str(limit), spec.workdir, *pairs], as_control=True,
                       timeout_s=limit + 120)
    lines = bytes(ran.output).split(b"\n")
    if ran.exit_code != 0 or len(lines) < 4:
        raise SetupError(f"harbor tests: expected the run's wrapper to report, got exit {ran.exit_code}: "
                         f"{bytes(ran.stderr).decode(errors='replace')[-300:]}")
    fields = lines[0].decode(errors="replace").split()
    if len(fields) != 3 or not fields[0].isdigit():
        raise SetupError(f"harbor tests: the run's wrapper recorded no exit status ({lines[0][:100]!r})")
    return RawHarborRun(exit_code=int(fields[0]), timed_out=fields[1] == "1", stopped=fields[2] == "1",
                        output=_decode_log(lines[1]),
                        reward_json=None if lines[2] == b"-" else _decode_log(lines[2]),
                        reward_txt=None if lines[3] == b"-" else _decode_log(lines[3]))


def reward_of(raw: RawHarborRun) -> tuple[float, str]:
    """(score, why): reward.json (a number, or an object whose `reward` — or only — value is one) and reward.txt
    (one number), each a finite number in [0, 1] or the score is 0. Harbor reads reward.json first; here, when
    test.sh left both, the lower counts: the tests' process tree can write either, and one written beside what the
    script wrote must not outrank it."""
    found = []
    for where, data, parse in (("reward.json", raw.reward_json, _json_reward), ("reward.txt", raw.reward_txt, _text_reward)):
        if data is None:
            continue
        try:
            value = parse(data)
        except (ValueError, TypeError, RecursionError, OverflowError) as error:
            return 0.0, f"{where}: {error}"
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            return 0.0, f"{where}: expected a reward in [0, 1], got {value!r}"
        found.append((value, where))
    if not found:
        return 0.0, "no reward: test.sh wrote neither /logs/verifier/reward.json nor reward.txt"
    return min(found)[0], "; ".join(f"{name}: {number:g}" for number, name in found)


def _json_reward(data: str) -> float:
    try:
        document = json.loads(data)
    except ValueError:
        raise ValueError(f"expected JSON, got {data[:80]!r}") from None
    value = document
    if isinstance(document, dict):
        value = document.get("reward", next(iter(document.values())) if len(document) == 1 else None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number or an object with a numeric `reward`, got {str(document)[:120]}")
    return float(value)


def _text_reward(data: str) -> float:
    try:
        return float(data)
    except ValueError:
        raise ValueError(f"expected a number, got {data[:80]!r}") from None
