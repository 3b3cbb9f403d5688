"""DockerBackend: containers with locked-down defaults, attached execs and label queries via docker-py.

Isolation set on every container: network "none", every capability dropped but the three the root shell
driver needs (layout.CONTROL_CAPS; agent processes never hold one), no-new-privileges,
memory with swap equal to it, a CPU quota, a pids limit, an init process, a read-only root with
size-limited tmpfs mounts, a raised nofile limit, never privileged, never the Docker socket.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import Ulimit
from requests.exceptions import ConnectionError as RequestsConnectionError

from sandboxes import labels as L
from sandboxes.backend import ContainerInfo, ExecResult, register_backend
from sandboxes.docker_client import docker_api
from sandboxes.errors import BackendUnavailable, ImageNotFound, SandboxDead, SandboxError
from sandboxes.layout import (
    CONTROL_CAPS,
    CONTROL_USER,
    SHM_SIZE,
    is_privileged,
    privileged_argv,
    sandbox_env,
    tmpfs_mounts,
)
from sandboxes.spec import SandboxSpec
from sandboxes.stream import ExecStream, StreamTimeout

log = logging.getLogger(__name__)
_FRACTION = re.compile(r"(\.\d{6})\d+")
_HOST_SLACK_S = 10.0  # the host waits this long past an in-container timeout before giving up


@register_backend("docker")
class DockerBackend:
    """The Docker engine as a SandboxBackend (thread-safe; one docker client per process)."""

    name = "docker"

    def __init__(self, *, base_url: str | None = None, max_pool_size: int = 32, timeout_s: float = 120.0) -> None:
        self._base_url = base_url
        self._max_pool_size = max_pool_size
        self._timeout_s = timeout_s
        self._nofile_cap: int | None = None

    @property
    def api(self) -> docker.APIClient:
        return docker_api(base_url=self._base_url, max_pool_size=self._max_pool_size, timeout_s=self._timeout_s)

    def ping(self) -> None:
        try:
            self.api.ping()
        except (DockerException, RequestsConnectionError) as error:
            raise BackendUnavailable(f"docker: expected a running Docker engine, got: {error}") from None

    def create_container(self, *, spec: SandboxSpec, labels: Mapping[str, str], name: str) -> str:
        nofile = min(spec.nofile, self._nofile_cap or spec.nofile)
        try:
            return self._create_and_start(spec=spec, labels=labels, name=name, nofile=nofile)
        except APIError as error:
            if "rlimit" not in str(error):
                raise
            # The engine cannot raise nofile above its own hard limit: learn that limit once, retry below it.
            self._nofile_cap = self._nofile_cap or _engine_nofile_limit()
            if nofile <= self._nofile_cap:
                raise
            log.info("nofile %d is above the Docker engine's limit; using %d", nofile, self._nofile_cap)
            return self._create_and_start(spec=spec, labels=labels, name=name, nofile=self._nofile_cap)

    def _create_and_start(self, *, spec: SandboxSpec, labels: Mapping[str, str], name: str, nofile: int) -> str:
        api = self.api
        host_config = api.create_host_config(
            network_mode=spec.network,
            cap_drop=["ALL"],
            cap_add=list(CONTROL_CAPS),  # for the root shell driver alone; see layout.CONTROL_CAPS
            security_opt=["no-new-privileges"],
            privileged=False,
            mem_limit=spec.memory,
            memswap_limit=spec.memory,
            nano_cpus=int(spec.cpus * 1e9),
            pids_limit=spec.pids,
            init=True,
            read_only=True,
            tmpfs=tmpfs_mounts(spec),
            shm_size=SHM_SIZE,
            ulimits=[Ulimit(name="nofile", soft=nofile, hard=nofile)],
            auto_remove=True,
        )
        try:
            created = api.create_container(
                image=spec.image,
                entrypoint=["sleep", str(spec.max_lifetime_s)],  # the container ends itself at max lifetime
                command=[],
                # Root, so that root execs (the shell driver) get CONTROL_CAPS: Docker grants a container's
                # capabilities to root execs only when the container's user is root. PID 1 (init and the
                # lifetime `sleep`) is root's too, so the agent can no more signal it than before.
                user=CONTROL_USER,
                labels=dict(labels),
                environment=sandbox_env(spec),
                working_dir="/",
                name=name,
                hostname="sandbox",
                host_config=host_config,
                network_disabled=spec.network == "none",
            )
        except NotFound as error:
            if "image" in str(error).lower():
                raise ImageNotFound(
                    f"image: expected {spec.image!r} on the Docker engine (build it with `crucible images build`, or "
                    "push it from the host that built it with `crucible images push`), got no such image"
                ) from None
            raise
        container_id = str(created["Id"])
        try:
            api.start(container_id)
        except BaseException:
            self.remove(container_id)
            raise
        return container_id

    def open_exec(
        self, container_id: str, *, argv: Sequence[str], user: str, env: Mapping[str, str], workdir: str
    ) -> ExecStream:
        api = self.api
        try:
            exec_id = api.exec_create(
                container_id, list(argv), stdin=True, stdout=True, stderr=True, tty=False,
                user=user, environment=dict(env), workdir=workdir,
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except NotFound:
            raise SandboxDead(f"container {container_id[:12]}: expected a running container, got none") from None
        except APIError as error:
            if error.status_code == 409:  # "container is not running" / "is paused"
                raise SandboxDead(f"container {container_id[:12]}: {error.explanation}") from None
            raise

        def exit_code() -> int | None:
            try:
                code = api.exec_inspect(exec_id).get("ExitCode")
                return None if code is None else int(code)
            except APIError:
                return None

        return ExecStream(sock, exit_code=exit_code)

    def exec(
        self,
        container_id: str,
        *,
        argv: Sequence[str],
        user: str,
        timeout_s: float,
        stdin: bytes | None = None,
        workdir: str = "/",
    ) -> ExecResult:
        # `timeout -k` inside the container: a host-side deadline alone would leave the process running.
        wrapped = ["timeout", "-k", "2", f"{timeout_s:g}", *argv]
        if is_privileged(user):
            wrapped = privileged_argv(wrapped)
        stream = self.open_exec(container_id, argv=wrapped, user=user, env={}, workdir=workdir)
        try:
            if stdin:
                stream.send(stdin)
            stream.close_stdin()
            try:
                stream.read_to_end(deadline=time.monotonic() + timeout_s + _HOST_SLACK_S)
            except StreamTimeout:
                return ExecResult(exit_code=124, output=bytes(stream.stdout), stderr=bytes(stream.stderr), timed_out=True)
            code = _wait_exit_code(stream)
            return ExecResult(
                exit_code=code, output=bytes(stream.stdout), stderr=bytes(stream.stderr), timed_out=code == 124
            )
        finally:
            stream.close()

    def pull_image(self, reference: str, *, as_image: str) -> None:
        """Pull `reference` (`registry/repository@sha256:…`) and tag it `as_image`; ImageNotFound if the
        registry does not have it, SandboxError if the pulled image is not the one the digest names."""
        try:
            self.api.pull(reference)
        except (NotFound, APIError) as error:
            raise ImageNotFound(f"image: expected {reference!r} in its registry, got {str(error)[:300]}") from None
        digests = self.api.inspect_image(reference).get("RepoDigests") or []
        if reference not in digests:
            raise SandboxError(f"image: expected {reference!r} among the pulled image's digests, got {digests[:4]}")
        repository, _, tag = as_image.rpartition(":")
        if not repository or "/" in tag:
            repository, tag = as_image, "latest"
        self.api.tag(reference, repository, tag)

    def remove(self, container_id: str) -> bool:
        try:
            self.api.remove_container(container_id, force=True, v=True)
            return True
        except NotFound:
            return False
        except APIError as error:
            if error.status_code == 409:  # removal already in progress (auto_remove or another caller)
                self._wait_gone(container_id)
                return False
            raise

    def _wait_gone(self, container_id: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.get(container_id) is not None:
            time.sleep(0.05)

    def list(self, *, labels: Mapping[str, str] | None = None) -> list[ContainerInfo]:
        wanted = [f"{k}={v}" for k, v in (labels or {}).items()] or [L.OWNER]
        rows = self.api.containers(all=True, filters={"label": wanted})
        return [
            ContainerInfo(
                id=row["Id"],
                name=(row.get("Names") or ["/?"])[0].lstrip("/"),
                image=row.get("Image", ""),
                state=row.get("State", "unknown"),
                created_at=float(row.get("Created", 0)),
                labels=row.get("Labels") or {},
            )
            for row in rows
        ]

    def get(self, container_id: str) -> ContainerInfo | None:
        try:
            data = self.api.inspect_container(container_id)
        except NotFound:
            return None
        return ContainerInfo(
            id=data["Id"],
            name=data.get("Name", "").lstrip("/"),
            image=data.get("Config", {}).get("Image", ""),
            state=data.get("State", {}).get("Status", "unknown"),
            created_at=_parse_time(data.get("Created", "")),
            labels=data.get("Config", {}).get("Labels") or {},
        )

    def logs(self, container_id: str, *, tail: int) -> bytes:
        try:
            return bytes(self.api.logs(container_id, stdout=True, stderr=True, tail=tail))
        except NotFound:
            raise SandboxDead(f"container {container_id[:12]}: expected a container, got none") from None

    def stats(self, container_id: str) -> dict[str, Any]:
        try:
            raw = self.api.stats(container_id, stream=False)
        except NotFound:
            raise SandboxDead(f"container {container_id[:12]}: expected a container, got none") from None
        return _summarize_stats(raw)


def _wait_exit_code(stream: ExecStream) -> int:
    for _ in range(100):  # the exec's output closes a moment before the engine records its exit code
        code = stream.exit_code()
        if code is not None:
            return int(code)
        time.sleep(0.01)
    raise SandboxError("docker exec: expected an exit code after the output closed, got none")


def _parse_time(value: str) -> float:
    try:
        return datetime.fromisoformat(_FRACTION.sub(r"\1", value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _summarize_stats(raw: Mapping[str, Any]) -> dict[str, Any]:
    mem = raw.get("memory_stats") or {}
    cpu, pre = raw.get("cpu_stats") or {}, raw.get("precpu_stats") or {}
    cpu_delta = (cpu.get("cpu_usage", {}).get("total_usage", 0)) - (pre.get("cpu_usage", {}).get("total_usage", 0))
    sys_delta = (cpu.get("system_cpu_usage") or 0) - (pre.get("system_cpu_usage") or 0)
    cpus = cpu.get("online_cpus") or 1
    return {
        "memory_bytes": mem.get("usage", 0),
        "memory_limit_bytes": mem.get("limit", 0),
        "cpu_percent": round(100.0 * cpu_delta / sys_delta * cpus, 2) if sys_delta > 0 else 0.0,
        "pids": (raw.get("pids_stats") or {}).get("current", 0),
        "pids_limit": (raw.get("pids_stats") or {}).get("limit"),
    }


def _engine_nofile_limit(default: int = 4096) -> int:
    """Hard nofile limit of the local dockerd/containerd (what a container may be given), else a default."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "comm").read_text().strip() not in ("dockerd", "containerd"):
                continue
            for line in (proc / "limits").read_text().splitlines():
                if line.startswith("Max open files"):
                    return int(line.split()[4])
        except (OSError, ValueError, IndexError):
            continue
    return default
