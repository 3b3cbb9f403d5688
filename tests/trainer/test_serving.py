"""`VllmServer` start-up failures: a readable error, and no process of the server's group left behind.

These start real vLLM processes (that fail or are stopped early); no server is healthy here, so they
never overlap with the module server of `test_vllm.py`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.errors import ConfigError
from trainer.errors import ServerStartError
from trainer.serving import VllmServer, group_members


def test_missing_weights_give_the_root_cause_and_leave_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "no-weights"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, broken / name)
    server = VllmServer(model_dir=broken, log_path=tmp_path / "server.log")
    with pytest.raises(ServerStartError) as caught:
        server.start()
    message = str(caught.value)
    assert "exited with code" in message
    assert "Cannot find any model weights" in message.splitlines()[0]  # the cause, first line
    assert str(tmp_path / "server.log") in message
    assert server.pid is not None and group_members(server.pid) == []


def test_start_timeout_stops_the_whole_group(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = VllmServer(model_dir=tiny_model_dir, startup_timeout_s=8, log_path=tmp_path / "server.log")
    with pytest.raises(ServerStartError, match="did not answer /health within 8 s"):
        server.start()
    assert server.pid is not None and group_members(server.pid) == []
    server.stop()  # idempotent


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
