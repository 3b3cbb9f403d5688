"""Several hosts on one machine: network namespaces on a bridge, each able to run a Docker engine of its own.

    with Fleet() as fleet:                      # bridge crf0, 10.77.0.1/24, in the machine's namespace
        w1 = fleet.host("w1")                   # namespace crf-w1 at 10.77.0.2, its veth on the bridge
        engine = w1.engine(insecure=["10.77.0.1:5000"])   # dockerd in it: own data root, exec root, socket
        w1.run(["python3", "-c", "..."])        # a process in the host's network namespace

A host reaches the others by their bridge addresses only: its own loopback is its own (nothing of the
machine's 127.0.0.1 is there), and the bridge has no route anywhere else. An engine's socket is a file,
so this test process drives it from outside, as a worker on that host would from inside. Everything made
is removed on exit, and what an earlier run left with the same prefix is removed first, so that a second
run on the same machine starts clean.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from sandboxes.docker_backend import DockerBackend

PREFIX = "crf"
SUBNET = "10.77.0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class Engine:
    """A dockerd of one host: its socket, its directories, its process."""

    socket: Path
    root: Path
    process: subprocess.Popen[bytes]

    def backend(self) -> DockerBackend:
        return DockerBackend(base_url=f"unix://{self.socket}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        _unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Host:
    name: str
    address: str
    namespace: str
    engines: list[Engine] = field(default_factory=list)

    def run(self, argv: list[str], **options: object) -> subprocess.CompletedProcess[str]:
        """`argv` run to completion in this host's network namespace."""
        return subprocess.run(self._entered(argv), capture_output=True, text=True, timeout=120,
                              **options)  # type: ignore[call-overload]

    def popen(self, argv: list[str], **options: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._entered(argv), **options)  # type: ignore[call-overload]

    def _entered(self, argv: list[str]) -> list[str]:
        """`argv` in this host's network namespace alone. (Not `ip netns exec`: it also mounts a /sys of its
        own, which hides the cgroup mounts a Docker engine needs.)"""
        return ["nsenter", f"--net=/run/netns/{self.namespace}", *argv]

    def engine(self, *, insecure: list[str] = (), timeout_s: float = 120.0) -> Engine:  # type: ignore[assignment]
        """A dockerd in this host's namespace, sandboxes without a network as on every host, trusting the
        `insecure` registries (host:port) over plain HTTP."""
        root = Path(tempfile.mkdtemp(prefix=f"{self.namespace}-engine-"))
        socket = root / "docker.sock"
        argv = ["dockerd", f"--data-root={root / 'data'}", f"--exec-root={root / 'exec'}", f"--pidfile={root / 'pid'}",
                f"--host=unix://{socket}", "--bridge=none", "--iptables=false", "--ip6tables=false",
                f"--cgroup-parent=/{self.namespace}", *(f"--insecure-registry={name}" for name in insecure)]
        log = open(root / "dockerd.log", "wb")  # noqa: SIM115 (kept open for the process's life)
        engine = Engine(socket=socket, root=root, process=self.popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                                     start_new_session=True))
        self.engines.append(engine)
        deadline = time.monotonic() + timeout_s  # a bound on waiting, not a timing claim
        while True:
            if engine.process.poll() is not None:
                raise RuntimeError(f"dockerd of {self.name} exited: {(root / 'dockerd.log').read_text()[-2000:]}")
            if socket.exists():
                with contextlib.suppress(Exception):
                    engine.backend().ping()
                    return engine
            if time.monotonic() > deadline:
                raise RuntimeError(f"dockerd of {self.name} did not answer: {(root / 'dockerd.log').read_text()[-2000:]}")
            time.sleep(0.2)


class Fleet:
    def __init__(self, *, prefix: str = PREFIX, subnet: str = SUBNET) -> None:
        self.prefix, self.subnet = prefix, subnet
        self.bridge = f"{prefix}0"
        self.address = f"{subnet}.1"
        """The machine's own address on the bridge (the control host's, here)."""
        self.hosts: list[Host] = []

    def __enter__(self) -> Fleet:
        cleanup(self.prefix)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def host(self, name: str) -> Host:
        namespace = f"{self.prefix}-{name}"
        address = f"{self.subnet}.{len(self.hosts) + 2}"
        veth = f"v{namespace}"[:15]
        _ip("netns", "add", namespace)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", veth, "master", self.bridge, "up")
        for argv in (["addr", "add", f"{address}/24", "dev", "eth0"], ["link", "set", "eth0", "up"],
                     ["link", "set", "lo", "up"]):
            _ip("-n", namespace, *argv)
        host = Host(name=name, address=address, namespace=namespace)
        self.hosts.append(host)
        return host

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for host in self.hosts:
            for engine in host.engines:
                engine.stop()
        cleanup(self.prefix)


def cleanup(prefix: str = PREFIX) -> None:
    """Remove every namespace, veth and bridge named with `prefix`, and the engines still running in them."""
    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    for namespace in namespaces:
        if not namespace.startswith(f"{prefix}-"):
            continue
        pids = _ip("netns", "pids", namespace, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", namespace, check=False)
    links = _ip("-o", "link", "show", check=False).stdout.splitlines()
    for line in links:
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name == f"{prefix}0" or name.startswith(f"v{prefix}-"):
            _ip("link", "del", name, check=False)
    for stale in Path(tempfile.gettempdir()).glob(f"{prefix}-*-engine-*"):
        _unmount_under(stale)
        shutil.rmtree(stale, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """Unmount whatever an engine left mounted under `root` (deepest first)."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(root))]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
