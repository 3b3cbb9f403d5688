"""Loopback ports: the one place a free port is picked."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it). Another process may take it before the
    caller binds it: callers that can pass port 0 to the server itself should."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
