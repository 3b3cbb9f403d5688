"""edit_file and write_file on files of every size, in a real code-repo sandbox: a file whose base64 is
longer than the shell's output capture (output_head + output_tail, 32 KiB by default) was read back with
its middle cut, and edit_file crashed the episode with a base64 error (found by the task factory's
shipped set: jmespath's parser.py is 27 KB)."""

from __future__ import annotations

import pytest

from environments.base import ToolCall
from environments.code_repo.tools import SHELL_TRANSFER_MAX, execute_tool
from environments.spec import parse_spec
from tests.support.calc import env_spec

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("size", [1_000, 24_000, 30_000, SHELL_TRANSFER_MAX - 10, SHELL_TRANSFER_MAX + 10, 200_000])
def test_a_file_of_any_size_is_edited_exactly(sandboxes, code_repo_image: str, calc_task_payload: dict,  # type: ignore[no-untyped-def]
                                             size: int) -> None:
    from environments.code_repo.task import CodeRepoTask

    task = CodeRepoTask.model_validate(calc_task_payload)
    text = "".join(f"line {i:07d} of filler\n" for i in range(size // 22))
    marker = f"line {len(text) // 44:07d} of filler\n"  # a line near the middle, where a capture cut falls
    pool = sandboxes.pool_for(parse_spec(env_spec(code_repo_image)))
    with pool.open_fresh() as sandbox:
        written = execute_tool(sandbox=sandbox, call=ToolCall("write_file", {"path": "big.txt", "content": text}),
                               task=task, timeout_s=60)
        assert written.exit_code == 0, written.observation
        edited = execute_tool(sandbox=sandbox, call=ToolCall("edit_file", {"path": "big.txt", "old_str": marker,
                                                                           "new_str": "EDITED\n"}),
                              task=task, timeout_s=60)
        assert (edited.exit_code, edited.observation) == (0, "edited /workspace/big.txt")
        assert sandbox.get_file("/workspace/big.txt").decode() == text.replace(marker, "EDITED\n", 1)
