"""(issue 24) No secret in any log: a real run through the public interfaces — `crucible api`, `crucible
worker`, `crucible controller` as processes, the run launched over REST with a bearer token, the policy
reached through a password-bearing URL, `crucible doctor` asked — and every line any of them wrote is
searched for the password and the token. httpx alone used to write the URL with its password three
times per policy call."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from api.services.tokens import create_token
from core.models import Task
from environments.service import register_environment
from environments.spec import parse_spec
from tests.api.live_server import ROOT, crucible_command, crucible_env, live_api
from tests.support.calc import FIX, env_spec
from tests.support.processes import launch_calc_eval, spawn_crucible, stop_group

# The worker's reaper sweeps every crucible container on the machine: with the other tests that do.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker-global")]

PASSWORD = "pw-Kq7-never-in-a-log"


def test_no_log_of_a_real_run_holds_the_policy_password_or_the_api_token(
    db_session: Session, scripted, code_repo_image, calc_task_payload, tmp_path: Path
) -> None:
    policy, url = scripted
    secret_url = url.replace("http://", f"http://crucible:{PASSWORD}@", 1)
    policy.scripts["secret"] = list(FIX)
    register_environment(db_session, spec=parse_spec(env_spec(code_repo_image)))
    db_session.add(Task(environment_name="calc", external_id="calc-secret", instruction="Fix add(). [script:secret]",
                        payload=calc_task_payload))
    _, token = create_token(db_session, name="log grep")
    db_session.commit()
    settings = {"policy_url": secret_url, "api_token": token, "data_dir": str(tmp_path),
                "worker_name": f"secret-{os.getpid()}", "sandbox_pool_min": "0", "worker_concurrency": "1"}
    headers = {"Authorization": f"Bearer {token}"}
    logs: dict[str, Path] = {}
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, *args: str) -> None:
        logs[name] = tmp_path / f"{name}.log"
        processes.append(spawn_crucible(logs[name], *args, env=crucible_env(**settings)))

    try:
        with live_api(tmp_path, **settings) as api:
            logs["api"] = api.log
            spawn("worker", "worker", "-Q", "code_repo")
            spawn("controller", "controller", "--poll", "0.5")
            run_id = launch_calc_eval(api.url, headers=headers, name="secret")
            status = ""
            for _ in range(1200):  # polls until the run ends; the test's timeout bounds it
                status = httpx.get(f"{api.url}/v1/runs/{run_id}", headers=headers, timeout=30).json()["status"]
                if status in ("completed", "failed"):
                    break
                time.sleep(0.25)
            assert status == "completed", (status, logs["worker"].read_text(errors="replace")[-3000:])
            replicas = httpx.get(f"{api.url}/v1/policy/replicas", headers=headers, timeout=30)
            assert replicas.status_code == 200, replicas.text
            doctor = subprocess.run(crucible_command("doctor"), cwd=ROOT, env=crucible_env(**settings),
                                    capture_output=True, text=True, timeout=120)
            (tmp_path / "doctor.log").write_text(doctor.stdout + doctor.stderr)
            logs["doctor"] = tmp_path / "doctor.log"
    finally:
        for process in processes:
            stop_group(process)
    texts = {name: path.read_text(errors="replace") for name, path in logs.items()}
    # The worker did call the policy through the secret URL and logged it (masked): the grep has a target.
    assert "HTTP Request: POST http://***@127.0.0.1" in texts["worker"], texts["worker"][-3000:]
    for name, text in texts.items():
        assert PASSWORD not in text, (name, [line for line in text.splitlines() if PASSWORD in line][:3])
        assert token not in text, (name, [line for line in text.splitlines() if token in line][:3])
