"""`crucible serve DIR --replicas N`: a local pool of vLLM servers, each pinned to its own cores and
serving its own copy of DIR under one model name.

The plan and the errors run in milliseconds; the end-to-end test (slow) starts two real vLLM servers
on CPU through the CLI, as a user would, and checks the cores of every thread they run.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from core.errors import ConfigError
from trainer.replicas import copy_model_dir, replica_plan
from trainer.serving import VllmServer, format_cores, group_members

ROOT = Path(__file__).parents[2]
CRUCIBLE = [sys.executable, "-m", "cli.main"]
REPLICA_LINE = re.compile(r"^replica (\d+): (\S+)  cores (\S+)  pid (\d+)  dir (.+?)  log (.+)$")


def test_two_replicas_on_two_cores_get_one_core_each_their_own_port_and_copy(tmp_path: Path) -> None:
    model = tmp_path / "model"
    plans = replica_plan(model_dir=model, replicas=2, port=8000, cores=[1, 0])
    assert [p.cpus for p in plans] == [(0,), (1,)]
    assert [p.port for p in plans] == [8000, 8001]
    assert [p.model_dir for p in plans] == [tmp_path / "model-replica-0", tmp_path / "model-replica-1"]
    assert {p.model_name for p in plans} == {str(model.resolve())}  # workers send one name


def test_cores_are_split_into_contiguous_shares(tmp_path: Path) -> None:
    four = replica_plan(model_dir=tmp_path / "m", replicas=2, port=8000, cores=[0, 1, 2, 3])
    assert [p.cpus for p in four] == [(0, 1), (2, 3)]
    five = replica_plan(model_dir=tmp_path / "m", replicas=2, port=8000, cores=[4, 5, 6, 7, 8])
    assert [p.cpus for p in five] == [(4, 5, 6), (7, 8)]  # the remainder goes to the first replicas
    one = replica_plan(model_dir=tmp_path / "m", replicas=1, port=8000, cores=[0, 1])
    assert [p.cpus for p in one] == [(0, 1)]


def test_port_zero_picks_distinct_free_ports_and_a_root_and_name_can_be_given(tmp_path: Path) -> None:
    plans = replica_plan(model_dir=tmp_path / "m", replicas=3, port=0, cores=[0, 1, 2],
                         replica_root=tmp_path / "copies", served_model_name="policy")
    ports = [p.port for p in plans]
    assert len(set(ports)) == 3 and all(ports)
    assert [p.model_dir for p in plans] == [tmp_path / "copies" / f"replica-{k}" for k in range(3)]
    assert {p.model_name for p in plans} == {"policy"}


@pytest.mark.parametrize(("replicas", "port", "message"), [
    (0, 8000, "expected at least 1 replica, got 0"),
    (-1, 8000, "expected at least 1 replica, got -1"),
    (3, 8000, "expected at most 2 replicas (one core each), got 3"),
    (2, 65535, "expected a port from 0 (a free one each) to 65534 (2 replicas take port, port+1, …), got 65535"),
    (2, -5, "got -5"),
])
def test_a_plan_that_cannot_be_kept_is_refused(tmp_path: Path, replicas: int, port: int, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        replica_plan(model_dir=tmp_path / "m", replicas=replicas, port=port, cores=[0, 1])
    assert message in str(caught.value)


def test_copies_inside_the_model_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected replica copies outside the model directory"):
        replica_plan(model_dir=tmp_path, replicas=1, port=8000, cores=[0], replica_root=tmp_path / "copies")


def test_a_copy_is_made_fresh_and_never_replaces_a_directory_that_is_not_one(tmp_path: Path) -> None:
    source = tmp_path / "model"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_text("original")
    copy = tmp_path / "model-replica-0"
    copy_model_dir(source, copy)
    (copy / "model.safetensors").write_text("trained")  # what the reload path leaves behind
    (copy / ".previous-weights").write_text("kept aside")
    copy_model_dir(source, copy)
    assert sorted(p.name for p in copy.iterdir()) == ["config.json", "model.safetensors"]
    assert (copy / "model.safetensors").read_text() == "original"

    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="to be absent or an earlier replica copy"):
        copy_model_dir(source, other)
    assert (other / "todo.txt").read_text() == "keep me"
    with pytest.raises(ConfigError, match=re.escape("expected a model directory with a config.json")):
        copy_model_dir(other, tmp_path / "elsewhere")


def test_a_pinned_server_binds_vllms_threads_to_its_cores_and_refuses_others(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    server = VllmServer(model_dir=tmp_path, port=8000, cpus=allowed[:1])
    assert server.cpus == (allowed[0],)
    assert server.environment()["VLLM_CPU_OMP_THREADS_BIND"] == str(allowed[0])
    unpinned = VllmServer(model_dir=tmp_path, port=8000).environment()  # vLLM's own choice, as before
    assert unpinned.get("VLLM_CPU_OMP_THREADS_BIND") == os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    with pytest.raises(ConfigError, match=re.escape(f"expected cores among {format_cores(allowed)} (this "
                                                    "process's affinity), got none")):
        VllmServer(model_dir=tmp_path, port=8000, cpus=())
    outside = max(allowed) + 1
    with pytest.raises(ConfigError) as caught:
        VllmServer(model_dir=tmp_path, port=8000, cpus=[outside])
    assert str(caught.value) == (f"expected cores among {format_cores(allowed)} (this process's affinity), "
                                 f"got {outside}")
    with pytest.raises(ConfigError, match=re.escape("expected a port from 0 (any free one) to 65535, got 70000")):
        VllmServer(model_dir=tmp_path, port=70000)


def test_format_cores_writes_ranges() -> None:
    assert format_cores([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert format_cores([3]) == "3"


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CRUCIBLE + args, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize(("args", "expected"), [
    (["--replicas", "0"], "expected at least 1 replica, got 0"),
    (["--replicas", "99"], f"expected at most {len(os.sched_getaffinity(0))} replicas (one core each), got 99"),
    (["--replicas", "2", "--port", "65535"], "expected a port from 0"),
    (["--port", "70000"], "expected a port from 0 (any free one) to 65535, got 70000"),
])
def test_bad_serve_options_are_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    result = _run(["serve", str(tmp_path), *args])
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def _task_cores(pid: int) -> set[str]:
    """Cpus_allowed_list of every thread of `pid` (vLLM pins its OpenMP threads one by one)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # exited while we looked
        found.add(re.search(r"^Cpus_allowed_list:\s*(\S+)$", status, re.M).group(1))  # type: ignore[union-attr]
    return found


@pytest.mark.slow  # two real vLLM servers on CPU through the CLI: a minute or two
def test_serve_replicas_end_to_end(tmp_path: Path) -> None:
    from trainer.tiny_model import make_tiny_model

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    model = make_tiny_model(out_dir=tmp_path / "model", seed=0).path
    command = [*CRUCIBLE, "serve", str(model), "--replicas", "2", "--port", "0", "--max-model-len", "512",
               "--startup-timeout", "540", "--log-file", str(tmp_path / "serve.log")]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    replicas: list[tuple[str, str, int, Path]] = []
    output: list[str] = []
    try:
        for line in process.stdout:
            output.append(line)
            if match := REPLICA_LINE.match(line.strip()):
                replicas.append((match[2], match[3], int(match[4]), Path(match[5])))
            if line.startswith("CRUCIBLE_POLICY_URLS="):
                assert line.strip().split("=", 1)[1].split(",") == [url for url, *_ in replicas]
                break
        assert len(replicas) == 2, "".join(output)
        roots = set()
        for url, cores, pid, directory in replicas:
            assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
            (card,) = httpx.get(f"{url}/models").json()["data"]
            assert card["id"] == str(model.resolve())  # one model name for the whole pool
            assert card["root"] == str(directory) and directory != model.resolve()
            roots.add(card["root"])
            members = group_members(pid)
            assert pid in members and len(members) >= 2  # the API server and its engine core at least
            for member in members:
                assert _task_cores(member) == {cores}, (member, _task_cores(member))
            completion = httpx.post(f"{url}/completions", timeout=120, json={
                "model": card["id"], "prompt": "hello", "max_tokens": 4, "temperature": 0})
            assert completion.status_code == 200 and completion.json()["choices"][0]["text"] is not None
        assert len(roots) == 2
        shares = [format_cores(plan.cpus) for plan in replica_plan(model_dir=model, replicas=2, port=8000)]
        assert [cores for _, cores, _, _ in replicas] == shares  # on 2 cores: "0" and "1"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, "".join(output) + process.stdout.read()
        for _, _, pid, _ in replicas:
            assert group_members(pid) == [], f"replica process group {pid} outlived serve"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        for _, _, pid, _ in replicas:
            for member in group_members(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)
