"""`crucible env serve ENV --openenv`, run as a user runs it (a subprocess), driven by the real OpenEnv client
from PyPI (`openenv-core`'s GenericEnvClient, not a client written here) on the calc code_repo task:

- the right fix earns 1 and a wrong fix the wrong-fix reward (rules and the public test pass, the hidden
  test fails), each from Crucible's own verifier; no observation ever holds the hidden test;
- 8 concurrent sessions each get a sandbox of their own; after they close, and after sessions that drop
  without a word, no sandbox stays leased, and once the server stops no container of it is left;
- a hostile message is an OpenEnv error naming what was expected, and the session goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from socket import SHUT_RDWR

import httpx
import pytest
from sqlalchemy.orm import Session
from websockets.sync.client import connect

from core.net import free_port
from environments.service import register_environment
from environments.spec import parse_spec
from sandboxes import labels as L
from tests import factories
from tests.support.calc import HIDDEN_TEST, env_spec

openenv = pytest.importorskip("openenv.core.generic_client", reason="needs openenv-core (scripts/setup.sh)")

pytestmark = pytest.mark.docker
ROOT = Path(__file__).parents[2]
NAME = "openenv-calc"
SESSIONS = 8


def _metadata(url: str) -> dict:
    return httpx.get(f"{url}/metadata", timeout=10).json()


def _wait_until_none_leased(url: str) -> dict:
    deadline = time.monotonic() + 120  # a bound on waiting, not a timing claim: releases reset the sandbox
    while True:
        metadata = _metadata(url)
        if (metadata["sandboxes"]["leased"] == 0 and metadata["sessions"] == 0) or time.monotonic() > deadline:
            return metadata
        time.sleep(0.25)


@contextmanager
def _serving(session: Session, backend, *, image: str, payload: dict, name: str = NAME, limits: dict | None = None,  # type: ignore[no-untyped-def]
             options: tuple[str, ...] = ()) -> Iterator[str]:
    """`crucible env serve NAME --openenv` in a subprocess, on three copies of the calc task; its base URL.
    On exit: SIGINT, a clean exit, and no container of it left."""
    env, _ = register_environment(session, spec=parse_spec({**env_spec(image, **(limits or {})), "name": name}))
    for index in range(3):
        factories.task(session, env, external_id=f"calc-{index}", instruction="Fix add() in calc.py.",
                       payload=json.loads(json.dumps(payload)))
    session.commit()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "env", "serve", name, "--openenv", "--port", str(port),
         "--max-sessions", str(SESSIONS), *options], cwd=ROOT, env={**os.environ, "COLUMNS": "250"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).json() == {"status": "healthy"}:
                break
        except httpx.HTTPError:
            pass
        assert server.poll() is None, server.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the server did not answer /health"
        time.sleep(0.25)
    try:
        yield url
    finally:
        server.send_signal(signal.SIGINT)
        output = server.communicate(timeout=120)[0]
        assert server.returncode == 0, output[-3000:]
        # Its own containers: made by its process. (Another test's server may serve the same name on the
        # other xdist worker at this very moment: its live sandboxes are not this one's leftovers.)
        left = [f"{info.sandbox_id} ({info.state}, created {info.labels.get(L.CREATED)}, owner "
                f"{info.labels.get(L.OWNER)}, pools {info.labels.get(L.POOLS)})"
                for info in backend.list(labels={L.WORKER: f"openenv-{name}"})
                if L.Owner.parse(info.labels.get(L.CREATOR, "")).pid == server.pid]
        if left:  # the server's own account last: a CI log shows the tail
            pytest.fail(f"containers left behind by the server: {', '.join(left)}; stopped at {time.time():.0f}; "
                        f"it printed:\n{output[-4000:]}", pytrace=False)


@pytest.fixture
def served(db_session: Session, code_repo_image: str, calc_task_payload: dict, backend) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with _serving(db_session, backend, image=code_repo_image, payload=calc_task_payload) as url:
        yield url


def _client(url: str):  # type: ignore[no-untyped-def]
    client = openenv.GenericEnvClient(base_url=url, message_timeout_s=180).sync()
    client.connect()
    return client


def _texts(result) -> str:  # type: ignore[no-untyped-def]
    return json.dumps(result.observation)


def test_the_real_openenv_client_plays_a_code_task_for_crucibles_reward(served: str, code_repo_image: str) -> None:
    weights = env_spec(code_repo_image)["verifier"]["weights"]
    wrong_fix_reward = weights["rules"] + weights["public_tests"]  # the hidden test fails, mul's still passes
    client = _client(served)
    seen = []
    try:
        first = client.reset(task_id="calc-1", episode_id="right")
        seen.append(first)
        assert first.done is False and first.reward is None
        assert first.observation["task_id"] == "calc-1" and "Fix add()" in first.observation["text"]
        assert {tool["function"]["name"] for tool in first.observation["tools"]} >= {"bash", "edit_file", "submit"}
        seen.append(client.step({"tool": "bash", "arguments": {"command": "cat calc.py; ls -a"}}))
        assert "return a - b" in seen[-1].observation["text"]
        seen.append(client.step({"tool": "edit_file", "arguments": {"path": "calc.py", "old_str": "return a - b",
                                                                     "new_str": "return a + b"}}))
        seen.append(client.step({"tool": "submit", "arguments": {}}))
        assert (seen[-1].done, seen[-1].reward) == (True, pytest.approx(1.0))
        assert seen[-1].observation["termination"] == "submitted"
        assert seen[-1].observation["reward_components"]["hidden_tests"] == pytest.approx(1.0)
        assert "flags" not in seen[-1].observation  # what the hack monitors saw would teach a client to evade them
        assert client.state()["step_count"] == 3 and client.state()["episode_id"] == "right"
        with pytest.raises(RuntimeError, match="reset first"):  # the episode is over: its sandbox went back
            client.step({"tool": "bash", "arguments": {"command": "true"}})

        seen.append(client.reset(task_id="calc-1"))  # a reset is a fresh sandbox: the fix is gone
        seen.append(client.step({"tool": "bash", "arguments": {"command": "grep -c 'a - b' calc.py"}}))
        assert seen[-1].observation["text"].strip().startswith("1")
        seen.append(client.step({"tool": "edit_file", "arguments": {"path": "calc.py", "old_str": "return a - b",
                                                                     "new_str": "return a * b"}}))
        seen.append(client.step({"tool": "submit", "arguments": {}}))
        assert (seen[-1].done, seen[-1].reward) == (True, pytest.approx(wrong_fix_reward))

        # Hostile actions: each refused in one line naming what was expected; the session goes on.
        client.reset(seed=2)
        for action, expected in (({"tool": "rm_rf"}, "step.tool: expected one of"),
                                 ({"tool": "bash", "arguments": "ls"}, "step.arguments: expected an object, got str"),
                                 ({"tool": "bash", "arguments": {}, "reward": 1.0}, "got also reward"),
                                 ({}, "step.tool: expected one of")):
            with pytest.raises(RuntimeError, match=expected):
                client.step(action)
        for reset, expected in (({"task_id": "nope"}, "no task 'nope'"), ({"seed": "1; drop"}, "reset.seed: expected an integer"),
                                ({"task_id": "x" * 10_000}, "reset.task_id: expected a task id")):
            with pytest.raises(RuntimeError, match=expected):
                client.reset(**reset)
        seen.append(client.reset(seed=4))  # 4 mod 3 tasks: calc-1
        assert seen[-1].observation["task_id"] == "calc-1"
    finally:
        client.close()
    hidden = HIDDEN_TEST.strip().splitlines()[-1].strip()  # "assert add(2, 3) == 5"
    assert all(hidden not in _texts(result) and "test_hidden" not in _texts(result) for result in seen)


def test_concurrent_sessions_each_lease_a_sandbox_and_none_is_left(served: str) -> None:
    read_back: dict[int, str] = {}
    errors: list[BaseException] = []
    all_wrote = threading.Barrier(SESSIONS, timeout=300)
    all_leased = threading.Barrier(SESSIONS + 1, timeout=300)
    done = threading.Event()

    def session(index: int) -> None:
        try:
            client = _client(served)
            try:
                client.reset(seed=index)
                client.step({"tool": "bash", "arguments": {"command": f"echo session-{index} > mine.txt"}})
                all_wrote.wait()  # every session has written its mark: a shared sandbox would show another's
                result = client.step({"tool": "bash", "arguments": {"command": "cat mine.txt"}})
                read_back[index] = result.observation["text"].strip()
                all_leased.wait()
                done.wait(300)
            finally:
                client.close()
        except BaseException as error:
            errors.append(error)
            all_wrote.abort()
            all_leased.abort()

    threads = [threading.Thread(target=session, args=(index,)) for index in range(SESSIONS)]
    for thread in threads:
        thread.start()
    all_leased.wait()
    metadata = _metadata(served)
    assert (metadata["sessions"], metadata["sandboxes"]["leased"]) == (SESSIONS, SESSIONS)
    with connect(served.replace("http", "ws") + "/ws") as extra:  # one session too many: refused, not queued
        reply = json.loads(extra.recv(timeout=30))
        assert reply["type"] == "error" and reply["data"]["code"] == "capacity"
    done.set()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert read_back == {index: f"session-{index}" for index in range(SESSIONS)}  # a sandbox each
    assert _wait_until_none_leased(served)["sandboxes"]["leased"] == 0

    # Sessions that drop mid-episode without a word (the socket cut), and hostile frames before that.
    for index in range(3):
        with connect(served.replace("http", "ws") + "/ws", max_size=None) as socket:
            socket.send("{not json")
            assert json.loads(socket.recv(timeout=30))["data"]["code"] == "invalid_json"
            socket.send(json.dumps({"type": "reset", "data": ["seed"]}))
            assert "message.data: expected an object, got list" in socket.recv(timeout=30)
            socket.send("x" * 1_500_000)
            assert json.loads(socket.recv(timeout=30))["data"]["code"] == "too_large"
            socket.send(b"\x00\x01binary")
            assert "expected a text frame of JSON, got a binary frame" in socket.recv(timeout=30)
            socket.send("[" * 200_000 + "]" * 200_000)  # nesting deeper than the parser's recursion
            assert json.loads(socket.recv(timeout=30))["data"]["code"] == "invalid_json"
            socket.send(json.dumps({"type": "step", "data": {"tool": "bash", "arguments": {}}}))
            assert "reset first" in socket.recv(timeout=30)
            socket.send(json.dumps({"type": "reset", "data": {"seed": index}}))
            assert json.loads(socket.recv(timeout=180))["type"] == "observation"
            socket.socket.shutdown(SHUT_RDWR)  # cut: no close frame, no "close" message
    metadata = _wait_until_none_leased(served)
    assert (metadata["sessions"], metadata["sandboxes"]["leased"]) == (0, 0)


def test_time_runs_out_for_a_late_step_and_a_silent_session(db_session: Session, code_repo_image: str,
                                                            calc_task_payload: dict, backend) -> None:  # type: ignore[no-untyped-def]
    """A step after the episode's time limit is not run: the episode ends as the agent loop ends one
    (episode_timeout) and is scored as such. A session silent past the idle limit is closed, its sandbox
    given back."""
    with _serving(db_session, backend, image=code_repo_image, payload=calc_task_payload, name="openenv-late",
                  limits={"episode_timeout_s": 2}, options=("--idle-timeout", "4")) as url:
        client = _client(url)
        try:
            client.reset(seed=0)
            time.sleep(2.5)
            late = client.step({"tool": "edit_file", "arguments": {"path": "calc.py", "old_str": "return a - b",
                                                                    "new_str": "return a + b"}})
            assert (late.done, late.observation["termination"], late.observation["status"]) == (
                True, "episode_timeout", "timeout")
            assert "edit_file was not run" in late.observation["text"]
            assert late.reward is not None and late.reward < 1.0  # the fix never happened: the hidden test fails
        finally:
            client.close()
        with connect(url.replace("http", "ws") + "/ws") as socket:
            socket.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            assert json.loads(socket.recv(timeout=180))["type"] == "observation"
            reply = json.loads(socket.recv(timeout=60))  # said nothing since: closed after the idle limit
            assert reply["data"]["code"] == "idle"
        metadata = _wait_until_none_leased(url)
        assert (metadata["sessions"], metadata["sandboxes"]["leased"]) == (0, 0)
