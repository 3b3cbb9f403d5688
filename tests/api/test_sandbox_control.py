"""(issue 50) Sandboxes on another host, reached through the API and the worker that holds them, never the
engine's socket: a worker's control service (task_workers/control.py, real HTTP on a loopback port, as a
worker host would serve it on its own address), the API forwarding the caller's token, and `crucible
sandbox ls / exec / cp --api` on top. Refused: no token, a revoked one, a bogus one sent straight to the
worker, a sandbox not leased to a run, one nobody made, one whose worker is gone; every hostile body,
path and id is one error naming what was expected."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from api.services.tokens import create_token, revoke_token
from cli.main import app as cli
from core.models import Worker
from sandboxes import SandboxBackend, SandboxPool, SandboxSpec
from sandboxes.db_events import DbEventSink
from task_workers.control import ControlServer, create_control_app
from tests import factories

pytestmark = pytest.mark.docker


@dataclass
class RemoteWorker:
    name: str
    url: str
    run_id: int
    leased: str
    """A sandbox leased to the run."""
    idle: str
    """A sandbox of the same worker leased to no run."""


@pytest.fixture
def remote(db_session: Session, backend: SandboxBackend, sandbox_images: dict[str, str]) -> Iterator[RemoteWorker]:
    base_spec = SandboxSpec(image=sandbox_images["base"], memory="256m", pids=128, workspace_size="16m",
                            tmp_size="16m", home_size="16m", capture_size="16m", command_timeout_s=20)
    name = f"w-remote-{secrets.token_hex(3)}"
    env = factories.queued_environment(db_session)
    the_task = factories.task(db_session, env, external_id="t-remote", instruction="Fix add().")
    group, (episode_id,) = factories.pending_group(db_session, env=env, the_task=the_task)
    factories.worker(db_session, name)  # alive: a fresh heartbeat
    events = DbEventSink()
    server = ControlServer(create_control_app(backend, worker=name), host="127.0.0.1", port=0)
    url = server.start()
    db_session.execute(update(Worker).where(Worker.name == name).values(control_url=url))
    db_session.commit()
    pool = SandboxPool(spec=base_spec, backend=backend, events=events, worker=name, min_size=0, max_size=2)
    try:
        with pool.lease(run_id=group.run_id, episode_id=episode_id) as leased, pool.lease() as idle:
            events.flush()
            yield RemoteWorker(name=name, url=url, run_id=group.run_id, leased=leased.id, idle=idle.id)
    finally:
        pool.close()
        server.stop()
        events.close()


def test_a_sandbox_on_a_worker_host_is_listed_run_in_and_copied_through_the_api(
        client: TestClient, remote: RemoteWorker, cli_env: None, tmp_path: Path) -> None:
    listed = client.get("/v1/sandboxes", params={"run_id": remote.run_id}).json()
    assert [(row["sandbox_id"], row["worker"], row["run"]) for row in listed["data"]] == [
        (remote.leased, remote.name, str(remote.run_id))], listed  # the idle one is leased to no run: not listed
    assert listed["unreachable"] == {}
    ran = client.post(f"/v1/sandboxes/{remote.leased}/exec",
                      json={"command": "echo hi > /workspace/f.txt; cat /workspace/f.txt; id -un"}).json()
    assert (ran["stdout"], ran["exit_code"], ran["worker"]) == ("hi\nagent\n", 0, remote.name)
    assert client.post(f"/v1/sandboxes/{remote.leased}/exec", json={"command": "exit 3"}).json()["exit_code"] == 3

    runner = CliRunner()
    result = runner.invoke(cli, ["sandbox", "ls", "--api", "--run", str(remote.run_id), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert [(row["sandbox_id"], row["worker"]) for row in json.loads(result.output)["data"]] == [
        (remote.leased, remote.name)]
    result = runner.invoke(cli, ["sandbox", "exec", "--api", remote.leased, "--", "cat", "/workspace/f.txt"])
    assert (result.exit_code, result.output) == (0, "hi\n")
    result = runner.invoke(cli, ["sandbox", "cp", "--api", f"{remote.leased}:/workspace/f.txt", str(tmp_path / "out.txt")])
    assert result.exit_code == 0 and (tmp_path / "out.txt").read_text() == "hi\n", result.output
    (tmp_path / "in.txt").write_text("from the control host\n")
    result = runner.invoke(cli, ["sandbox", "cp", "--api", str(tmp_path / "in.txt"), f"{remote.leased}:/workspace/"])
    assert result.exit_code == 0, result.output
    assert client.post(f"/v1/sandboxes/{remote.leased}/exec",
                       json={"command": "cat /workspace/in.txt"}).json()["stdout"] == "from the control host\n"


def test_who_may_not_reach_a_sandbox_is_refused(
        client: TestClient, anonymous: TestClient, remote: RemoteWorker, db_session: Session, token: str) -> None:
    exec_path = f"/v1/sandboxes/{remote.leased}/exec"
    assert anonymous.post(exec_path, json={"command": "id"}).status_code == 401
    revoked, plaintext = create_token(db_session, name="revoked")
    db_session.commit()
    revoke_token(db_session, ref=revoked.prefix)
    db_session.commit()
    assert client.post(exec_path, json={"command": "id"},
                       headers={"Authorization": f"Bearer {plaintext}"}).status_code == 401
    # Straight to the worker, past the API: the worker checks the token itself.
    for headers in ({}, {"Authorization": "Bearer cru_forged"}, {"Authorization": f"Bearer {plaintext}"}):
        assert httpx.post(f"{remote.url}{exec_path}", json={"command": "id"}, headers=headers).status_code == 401
    # The token is checked before any byte of the body is read; a body past the limit is refused as it comes.
    huge = b"{" + b" " * 1_000_000 + b"}"
    assert httpx.post(f"{remote.url}{exec_path}", content=huge).status_code == 401
    assert httpx.post(f"{remote.url}{exec_path}", content=huge,
                      headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}).status_code == 413
    idle = client.post(f"/v1/sandboxes/{remote.idle}/exec", json={"command": "id"})
    assert idle.status_code == 404 and "leased to a run, got one leased to none" in idle.json()["error"]["message"]
    unknown = client.post("/v1/sandboxes/sb-0000000000/exec", json={"command": "id"})
    assert unknown.status_code == 404 and "got none by that id" in unknown.json()["error"]["message"]
    db_session.execute(update(Worker).where(Worker.name == remote.name).values(stopped_at=Worker.last_heartbeat_at))
    db_session.commit()
    gone = client.post(exec_path, json={"command": "id"})
    assert gone.status_code == 404 and f"its worker {remote.name!r} not alive" in gone.json()["error"]["message"]
    assert client.get("/v1/sandboxes").json()["data"] == []


HOSTILE_BODIES = [
    ({"command": ""}, "command"),
    ({"command": "x" * 70_000}, "command"),
    ({"command": "id", "timeout_s": 1e9}, "timeout_s"),
    ({"command": "id", "timeout_s": -1}, "timeout_s"),
    ({"command": "id", "user": "root"}, "user"),
    ({"command": ["id"]}, "command"),
]


def test_hostile_bodies_paths_and_ids_are_refused(client: TestClient, remote: RemoteWorker) -> None:
    for body, expected in HOSTILE_BODIES:
        response = client.post(f"/v1/sandboxes/{remote.leased}/exec", json=body)
        assert response.status_code == 422 and expected in response.text, body
    for path in ("relative/x", "", "/x\x00y", "/" + "a" * 5000):
        assert client.get(f"/v1/sandboxes/{remote.leased}/archive", params={"path": path}).status_code == 422, path
    assert client.post("/v1/sandboxes/sb-..%2F..%2Fetc/exec", json={"command": "id"}).status_code in (404, 422)
    assert client.get("/v1/sandboxes", params={"run_id": "1; drop"}).status_code == 422
    missing = client.get(f"/v1/sandboxes/{remote.leased}/archive", params={"path": "/no/such/file"})
    assert missing.status_code == 404
    result = CliRunner().invoke(cli, ["sandbox", "exec", "--api", "../../etc", "--", "id"])
    assert result.exit_code == 2 and "expected a sandbox id (sb- and 10 hex digits) with --api" in result.output
