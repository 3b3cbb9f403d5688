"""The buggy-calculator code_repo task most episode tests play: add() subtracts, the public test checks mul,
the hidden test add; FIX is the scripted policy's right fix, and env_spec the environment it is played in.
(The red team's variant, with a second hidden test and a reference solution, is tests/support/calc_red.py.)"""

from __future__ import annotations

from environments.parsing import hermes_call

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
PUBLIC_TEST = "from calc import mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n"
HIDDEN_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"

FIX = [
    hermes_call("bash", command="cat calc.py"),
    hermes_call("edit_file", path="calc.py", old_str="return a - b", new_str="return a + b"),
    hermes_call("run_tests"),
    hermes_call("submit"),
]


def env_spec(image: str, **limits: object) -> dict:
    return {
        "name": "calc", "kind": "code_repo", "image": image,
        "sandbox": {"memory": "512m", "pids": 256, "workspace_size": "64m", "tmp_size": "64m", "max_lifetime_s": 900},
        "limits": {"max_turns": 6, "episode_timeout_s": 120, "tool_timeout_s": 20, "max_tool_errors": 3, **limits},
        "verifier": {"weights": {"rules": 0.1, "public_tests": 0.2, "hidden_tests": 0.7}},
    }
