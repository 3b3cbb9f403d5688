"""`crucible api` as a real process on a free port, for what only a real server shows: request-head
limits (uvicorn's protocol), memory under a huge body, the access log, refusing to start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from core.net import free_port

ROOT = Path(__file__).resolve().parents[2]


def crucible_env(**settings: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("CRUCIBLE_")}
    env.update({"CRUCIBLE_DATABASE_URL": os.environ["CRUCIBLE_DATABASE_URL"],
                "CRUCIBLE_DATA_DIR": os.environ.get("CRUCIBLE_DATA_DIR", "/tmp"), "PYTHONUNBUFFERED": "1"})
    env.update({f"CRUCIBLE_{key.upper()}": value for key, value in settings.items()})
    return env


def crucible_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


@dataclass
class LiveApi:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def memory_kib(self, field: str = "VmRSS") -> int:
        """VmRSS (now) or VmHWM (the peak so far) of the API process, from /proc."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} for pid {self.process.pid}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def live_api(tmp_path: Path, **settings: str) -> Iterator[LiveApi]:
    port = free_port()
    log = tmp_path / f"api-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(crucible_command("api", "--port", str(port)), cwd=ROOT, stdout=sink,
                                   stderr=subprocess.STDOUT, env=crucible_env(**settings))
    api = LiveApi(url=f"http://127.0.0.1:{port}", port=port, process=process, log=log)
    try:
        for _ in range(600):  # startup polls, not a timed assertion: the loop ends at the first answer
            if process.poll() is not None:
                raise AssertionError(f"crucible api exited {process.returncode}: {api.log_text()[-2000:]}")
            try:
                if httpx.get(f"{api.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield api
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
