"""ExecStream: one attached process's stdin/stdout over a socket, read with deadlines.

Docker multiplexes a non-TTY exec's output as frames: an 8-byte header (stream id, 3 zero bytes,
big-endian length) then the payload. We demultiplex ourselves instead of using docker-py's
generators so every read has a deadline (docker-py's have none) and no generator leaks a descriptor.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from sandboxes.errors import SessionError

_HEADER = struct.Struct(">BxxxI")
_CHUNK = 256 << 10
_STDERR_KEEP = 64 << 10


class StreamClosed(SessionError):
    """The process closed its output (it exited or was killed)."""


class StreamTimeout(SessionError):
    """Nothing more arrived before the deadline."""


class ExecStream:
    """Stdin writer + demultiplexed stdout reader for one attached process."""

    def __init__(
        self,
        sock: Any,
        *,
        multiplexed: bool = True,
        exit_code: Callable[[], int | None] | None = None,
        keepalive: Any = None,
    ) -> None:
        self._owner = sock  # docker-py's SocketIO wrapper; closing it closes the connection
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        self._multiplexed = multiplexed
        self._exit_code = exit_code
        self._keepalive = keepalive  # the HTTP response object, kept alive while we read
        self._raw = bytearray()
        self._buf = bytearray(_CHUNK)  # reused for every recv
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.eof = False

    def send(self, data: bytes) -> None:
        try:
            self._sock.settimeout(max(30.0, len(data) / (4 << 20)))  # a total deadline: >= 4 MB/s
            self._sock.sendall(data)
        except OSError as error:
            raise StreamClosed(f"could not write to the process: {error}") from None

    def close_stdin(self) -> None:
        """Half-close: the process sees EOF on stdin."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def read_until(self, marker: bytes, *, deadline: float, start: int = 0) -> int:
        """Index just past the first `marker` in stdout at or after `start` (reads until it appears)."""
        while True:
            index = self.stdout.find(marker, start)
            if index >= 0:
                return index + len(marker)
            start = max(start, len(self.stdout) - len(marker) + 1)
            self._fill(deadline)

    def read_exact(self, n: int, *, deadline: float) -> None:
        """Read until stdout holds at least `n` bytes."""
        while len(self.stdout) < n:
            self._fill(deadline)

    def take(self, n: int) -> bytes:
        """Remove and return the first `n` bytes of stdout."""
        data = bytes(self.stdout[:n])
        del self.stdout[:n]
        return data

    def read_to_end(self, *, deadline: float) -> None:
        """Read until the process closes its output."""
        try:
            while True:
                self._fill(deadline)
        except StreamClosed:
            return

    def exit_code(self) -> int | None:
        return self._exit_code() if self._exit_code else None

    def close(self) -> None:
        for closer in (self._sock.close, getattr(self._owner, "close", None), getattr(self._keepalive, "close", None)):
            try:
                if closer is not None:
                    closer()
            except Exception:  # already closed or half-torn-down; nothing to do
                pass

    def _fill(self, deadline: float) -> None:
        if self.eof:
            raise StreamClosed("the process closed its output")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StreamTimeout("no output before the deadline")
        self._sock.settimeout(remaining)
        buf = self._buf
        try:
            n = self._sock.recv_into(buf)
        except TimeoutError:
            raise StreamTimeout("no output before the deadline") from None
        except OSError as error:
            self.eof = True
            raise StreamClosed(f"connection lost: {error}") from None
        if n == 0:
            self.eof = True
            raise StreamClosed("the process closed its output")
        view = memoryview(buf)[:n]
        if not self._multiplexed:
            self.stdout += view
            return
        self._raw += view
        self._demux()

    def _demux(self) -> None:
        raw = self._raw
        pos = 0
        while len(raw) - pos >= _HEADER.size:
            kind, size = _HEADER.unpack_from(raw, pos)
            if len(raw) - pos - _HEADER.size < size:
                break
            payload = memoryview(raw)[pos + _HEADER.size : pos + _HEADER.size + size]
            (self.stderr if kind == 2 else self.stdout).extend(payload)
            payload.release()
            pos += _HEADER.size + size
        del raw[:pos]
        if len(self.stderr) > _STDERR_KEEP:  # diagnostics only: keep the tail
            del self.stderr[: len(self.stderr) - _STDERR_KEEP]
