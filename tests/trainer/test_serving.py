"""`VllmServer` start-up failures: a readable error, and no process of the server's group left behind.

These start real vLLM processes (that fail or are stopped early), on the xdist worker of the other
vLLM tests (marked `vllm`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.errors import ConfigError
from trainer.errors import ServerStartError
from trainer.serving import VllmServer, group_members

pytestmark = pytest.mark.vllm


def test_a_server_that_fails_or_never_answers_gives_the_cause_and_leaves_nothing(
    tiny_model_dir: Path, tmp_path: Path,
) -> None:
    """Two real start-ups at once (one vLLM import's time, not two): a model without weights exits with
    the root cause on the error's first line; one that does not answer /health in 8 s is stopped, its
    whole process group with it."""
    from concurrent.futures import ThreadPoolExecutor

    broken = tmp_path / "no-weights"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, broken / name)
    failing = VllmServer(model_dir=broken, log_path=tmp_path / "broken.log")
    slow = VllmServer(model_dir=tiny_model_dir, startup_timeout_s=8, log_path=tmp_path / "slow.log")

    def start(server: VllmServer) -> str:
        with pytest.raises(ServerStartError) as caught:
            server.start()
        return str(caught.value)

    with ThreadPoolExecutor(2) as pool:
        failed, timed_out = pool.map(start, (failing, slow))
    assert "exited with code" in failed
    assert "Cannot find any model weights" in failed.splitlines()[0]  # the cause, first line
    assert str(tmp_path / "broken.log") in failed
    assert "did not answer /health within 8 s" in timed_out
    for server in (failing, slow):
        assert server.pid is not None and group_members(server.pid) == []
    slow.stop()  # idempotent


def test_directory_without_config_fails_before_starting(tmp_path: Path) -> None:
    server = VllmServer(model_dir=tmp_path)
    with pytest.raises(ServerStartError, match=r"config\.json"):
        server.start()
    assert server.pid is None


def test_port_zero_picks_a_free_port_and_builds_the_command(tiny_model_dir: Path) -> None:
    server = VllmServer(model_dir=tiny_model_dir, port=0, served_model_name="policy", kv_cache_gib=2)
    assert 0 < server.port < 65536
    assert server.api_url == f"http://127.0.0.1:{server.port}/v1"
    command = server.command()
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert command[command.index("--served-model-name") + 1] == "policy"
    env = server.environment()
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    with pytest.raises(ConfigError, match="at least 1 GiB"):
        VllmServer(model_dir=tiny_model_dir, kv_cache_gib=0)
