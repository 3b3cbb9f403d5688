"""Several hosts on one machine: network namespaces on a bridge, each with a hostname of its own (a UTS
namespace) and able to run a Docker engine of its own.

    with Fleet() as fleet:                      # bridge crf0, 10.77.0.1/24, in the machine's namespace
        w1 = fleet.host("w1")                   # namespace crf-w1 at 10.77.0.2, its veth on the bridge
        engine = w1.engine(insecure=["10.77.0.1:5000"])   # dockerd in it: own data root, exec root, socket
        w1.run(["python3", "-c", "..."])        # a process in the host's namespaces (hostname crf-w1)
        fleet.lose(w1)                          # every process of it killed, sandboxes too; its network gone
        fleet.restore(w1)                       # back at its address, its disk (an engine's root) as it was
        fleet.cut(w1); fleet.cut(w1, off=False) # off the network and back, its processes running on

A host reaches the others by their bridge addresses only: its own loopback is its own (nothing of the
machine's 127.0.0.1 is there), and the bridge has no route anywhere else. An engine's socket is a file,
so this test process drives it from outside, as a worker on that host would from inside. Everything made
is removed on exit, and what an earlier run left with the same prefix is removed first, so that a second
run on the same machine starts clean.
"""

from __future__ import annotations

import contextlib
import os
import pwd
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
UTS_DIR = Path("/run") / f"{PREFIX}-uts"
"""Where each host's UTS namespace (its hostname) is pinned: a file bind-mounted by `unshare --uts=FILE`."""


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
        return subprocess.run(self.entered(argv), capture_output=True, text=True, timeout=120,
                              **options)  # type: ignore[call-overload]

    def popen(self, argv: list[str], **options: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.entered(argv), **options)  # type: ignore[call-overload]

    def entered(self, argv: list[str], *, user: str | None = None) -> list[str]:
        """`argv` in this host's network namespace alone, as `user` where given. (Not `ip netns exec`: it
        also mounts a /sys of its own, which hides the cgroup mounts a Docker engine needs.)"""
        drop = []
        if user is not None:
            entry = pwd.getpwnam(user)
            drop = [f"--setuid={entry.pw_uid}", f"--setgid={entry.pw_gid}"]
        return ["nsenter", f"--net=/run/netns/{self.namespace}", f"--uts={UTS_DIR / self.namespace}", *drop, *argv]

    def processes(self) -> list[int]:
        """Every process of this host: those in its network namespace (its services, its engine and the
        engine's shims) and its sandboxes' (in its engine's cgroups; a sandbox has a network of its own)."""
        pids = {int(pid) for pid in _ip("netns", "pids", self.namespace, check=False).stdout.split()}
        for procs in Path("/sys/fs/cgroup").glob(f"*/{self.namespace}/**/cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(pid) for pid in procs.read_text().split()}
        return sorted(pids)

    def engine(self, *, insecure: list[str] = (), timeout_s: float = 120.0,  # type: ignore[assignment]
               root: Path | None = None) -> Engine:
        """A dockerd in this host's namespace, sandboxes without a network as on every host, trusting the
        `insecure` registries (host:port) over plain HTTP. `root`: an earlier engine's (a host come back
        with its disk: its images and the containers it had)."""
        if root is None:
            root = Path(tempfile.mkdtemp(prefix=f"{self.namespace}-engine-"))
        else:
            _unmount_under(root)  # what the lost engine left mounted
            self.engines = [engine for engine in self.engines if engine.root != root]  # it is dead; this one owns root
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
        """A new host on the bridge at the next address, its hostname its namespace's name."""
        host = Host(name=name, address=f"{self.subnet}.{len(self.hosts) + 2}", namespace=f"{self.prefix}-{name}")
        self._plug(host)
        self.hosts.append(host)
        return host

    def lose(self, host: Host) -> None:
        """The host is lost, as to a power cut: every process of it SIGKILLed (services, engine, sandboxes)
        and its network removed. What it wrote to disk stays (an engine's root: `restore`)."""
        for _ in range(5):  # a shim may start a process while the others die: until none is left
            pids = host.processes()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        for engine in host.engines:
            with contextlib.suppress(subprocess.TimeoutExpired):
                engine.process.wait(30)
        _ip("netns", "del", host.namespace, check=False)  # its veth goes with it
        _unpin_uts(host.namespace)

    def cut(self, host: Host, *, off: bool = True) -> None:
        """The host cut off the network (its link to the bridge down), its processes running on; `off=False`
        joins it again."""
        _ip("link", "set", f"v{host.namespace}"[:15], "down" if off else "up")

    def restore(self, host: Host) -> None:
        """A lost host back at its address, with its hostname; start its engine again on its old root."""
        self._plug(host)

    def _plug(self, host: Host) -> None:
        veth = f"v{host.namespace}"[:15]
        _ip("netns", "add", host.namespace)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
        _ip("link", "set", veth, "master", self.bridge, "up")
        for argv in (["addr", "add", f"{host.address}/24", "dev", "eth0"], ["link", "set", "eth0", "up"],
                     ["link", "set", "lo", "up"]):
            _ip("-n", host.namespace, *argv)
        UTS_DIR.mkdir(parents=True, exist_ok=True)
        pinned = UTS_DIR / host.namespace
        pinned.touch()
        subprocess.run(["unshare", f"--uts={pinned}", "hostname", host.namespace], check=True, capture_output=True,
                       timeout=30)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for host in self.hosts:
            for engine in host.engines:
                engine.stop()
        cleanup(self.prefix)


def cleanup(prefix: str = PREFIX) -> None:
    """Remove every namespace, veth and bridge named with `prefix`, the processes still running in them (engines,
    services), and their state directories."""
    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    for namespace in namespaces:
        if not namespace.startswith(f"{prefix}-"):
            continue
        pids = _ip("netns", "pids", namespace, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", namespace, check=False)
    for procs in Path("/sys/fs/cgroup").glob(f"*/{prefix}-*/**/cgroup.procs"):  # sandboxes of a lost engine
        with contextlib.suppress(OSError, ValueError):
            for pid in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    for pinned in UTS_DIR.glob(f"{prefix}-*") if UTS_DIR.exists() else ():
        _unpin_uts(pinned.name)
    with contextlib.suppress(OSError):
        UTS_DIR.rmdir()
    links = _ip("-o", "link", "show", check=False).stdout.splitlines()
    for line in links:
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name == f"{prefix}0" or name.startswith(f"v{prefix}-"):
            _ip("link", "del", name, check=False)
    for stale in Path(tempfile.gettempdir()).glob(f"{prefix}-*-*-*"):  # an engine's, a service's state
        if stale.is_dir():
            _unmount_under(stale)
            shutil.rmtree(stale, ignore_errors=True)


def _unpin_uts(namespace: str) -> None:
    pinned = UTS_DIR / namespace
    subprocess.run(["umount", str(pinned)], capture_output=True, timeout=30)
    pinned.unlink(missing_ok=True)


def _unmount_under(root: Path) -> None:
    """Unmount whatever an engine left mounted under `root` (deepest first)."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(root))]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
