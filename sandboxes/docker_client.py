"""One docker-py APIClient per process: created lazily, thrown away in a forked child.

A client's connection pool must not be shared across fork (the child would read the parent's
sockets), and docker-py keeps only 10 connections unless told otherwise, so `max_pool_size` is
sized to the number of threads that talk to the engine at once.
"""

from __future__ import annotations

import os
import threading

import docker
from docker.errors import DockerException
from docker.utils import kwargs_from_env

from sandboxes.errors import BackendUnavailable

_lock = threading.Lock()
_clients: dict[tuple[str | None, int, float], docker.APIClient] = {}
_pid = os.getpid()


def _forget_after_fork() -> None:
    global _pid
    _clients.clear()  # the parent's sockets are not ours; never close them from here
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forget_after_fork)


def docker_api(*, base_url: str | None = None, max_pool_size: int = 32, timeout_s: float = 120.0) -> docker.APIClient:
    """The process-wide low-level client for `base_url` (DOCKER_HOST or the local socket if None)."""
    key = (base_url, max_pool_size, timeout_s)
    with _lock:
        if _pid != os.getpid():  # fork without register_at_fork (e.g. os.fork in C code)
            _forget_after_fork()
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = _connect(base_url, max_pool_size, timeout_s)
        return client


def _connect(base_url: str | None, max_pool_size: int, timeout_s: float) -> docker.APIClient:
    kwargs = kwargs_from_env()
    if base_url:
        kwargs["base_url"] = base_url
    where = kwargs.get("base_url") or "unix:///var/run/docker.sock"
    try:
        return docker.APIClient(version="auto", timeout=timeout_s, max_pool_size=max_pool_size, **kwargs)
    except DockerException as error:
        raise BackendUnavailable(
            f"docker: expected a running Docker engine at {where}, got an error: {error}"
        ) from None
