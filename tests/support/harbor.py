"""The Harbor task folder the tests play: examples/harbor/fix-calc, written to the format's spec (harbor's docs and
its Task model): the calc bug at /app, tests/test.sh running pytest on tests/test_outputs.py and writing
/logs/verifier/reward.txt as Harbor's own task template does, solution/solve.sh the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

from environments.parsing import hermes_call

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "harbor" / "fix-calc"
"""The shipped example (examples/harbor.yaml's task): its environment FROM crucible/code-repo:latest."""
INSTRUCTION = (EXAMPLE / "instruction.md").read_text()
TEST_SH = (EXAMPLE / "tests" / "test.sh").read_text()
TEST_OUTPUTS = (EXAMPLE / "tests" / "test_outputs.py").read_text()


FIX = [
    hermes_call("bash", command="cat /app/calc.py"),
    hermes_call("edit_file", path="calc.py", old_str="return a - b", new_str="return a + b"),
    hermes_call("submit"),
]
WRONG = [hermes_call("edit_file", path="calc.py", old_str="return a - b", new_str="return a * b"),
         hermes_call("submit")]


def write_calc_task(root: Path, *, base_image: str, name: str = "harbor-calc", instruction: str = INSTRUCTION) -> Path:
    """`root/name`: the example, its environment FROM `base_image` (an image this engine holds: nothing is pulled)."""
    folder = root / name
    shutil.copytree(EXAMPLE, folder)
    dockerfile = folder / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("FROM crucible/code-repo:latest", f"FROM {base_image}"))
    (folder / "instruction.md").write_text(instruction)
    return folder
