"""How `crucible api` serves the app: uvicorn on h11 with bounds on what a client can make it hold.

    serve(host="127.0.0.1", port=8080)

httptools (uvicorn's default when installed) has no limit on a request's head: one 50 MB header is
buffered whole and stalls every other request. h11 refuses a head over CRUCIBLE_API_MAX_HEADER_BYTES;
`BoundedH11Protocol` answers that with 431 in the API's one error shape (uvicorn itself sends a bare
400). `limit_concurrency` answers 503 past CRUCIBLE_API_MAX_CONNECTIONS instead of queueing without
end. Bodies are bounded by `api.limits`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections import Counter
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.errors import error_body
from core.errors import ServiceUnavailable
from core.settings import get_settings

KEEP_ALIVE_S = 5
logger = logging.getLogger(__name__)
class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering a malformed or oversized request head with its real status, and
    bounding what a client can hold: a deadline for each request's head (from the connection's first byte,
    or its opening) and for its body (from its head), and at most CRUCIBLE_API_MAX_CLIENT_CONNECTIONS
    connections per client address. A slow client is closed at its deadline; the others are served."""

    _open: ClassVar[Counter[str]] = Counter()
    """Connections open per client address (one event loop: no lock)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusal_status = 400
        self._address = ""
        self._deadline: asyncio.TimerHandle | None = None
        next_event = self.conn.next_event

        def remembering_next_event() -> Any:
            try:
                event = next_event()
            except h11.RemoteProtocolError as error:
                self._refusal_status = error.error_status_hint  # 431 for a head over the limit
                raise
            if isinstance(event, h11.Request):
                # h11 bounds only what it buffers before a head completes: a 100 KB header that arrives
                # whole, with its blank line, parsed unchecked. The head's own size is checked here.
                size = len(event.method) + len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                if size > get_settings().api_max_header_bytes:
                    self._refusal_status = 431
                    raise h11.RemoteProtocolError("request head over the limit", error_status_hint=431)
                self._arm("body", get_settings().api_body_timeout_s)
            elif isinstance(event, h11.EndOfMessage):
                self._disarm()
            return event

        self.conn.next_event = remembering_next_event  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._address = self.client[0] if self.client else ""
        self._open[self._address] += 1
        if self._open[self._address] > get_settings().api_max_client_connections:
            logger.warning("closed a connection from %s: it holds %d already (CRUCIBLE_API_MAX_CLIENT_CONNECTIONS)",
                           self._address, self._open[self._address] - 1)
            transport.close()
            return
        self._arm("head", get_settings().api_head_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._open[self._address] -= 1
        if self._open[self._address] <= 0:
            del self._open[self._address]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:  # a new request's first bytes
            self._arm("head", get_settings().api_head_timeout_s)
        super().data_received(data)

    def _arm(self, part: str, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire, part, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, part: str, seconds: float) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            logger.warning("closed a connection from %s: its request %s took over %g s", self._address, part, seconds)
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        status = self._refusal_status
        limit = get_settings().api_max_header_bytes
        message = (f"request head: expected at most {limit} bytes of request line and headers, got more"
                   if status == 431 else "request: expected an HTTP/1.1 request, got one that does not parse")
        code = "request_header_fields_too_large" if status == 431 else "bad_request"
        payload = json.dumps(error_body(code, message)).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=status, headers=headers)) or b"")
            self.transport.write(self.conn.send(h11.Data(data=payload)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # the connection cannot carry a response any more
            pass
        self.transport.close()


def uvicorn_config(*, host: str, port: int, app: Any = "api.main:app") -> uvicorn.Config:
    settings = get_settings()
    return uvicorn.Config(
        app, host=host, port=port, log_level=settings.log_level.lower(), http=BoundedH11Protocol,
        h11_max_incomplete_event_size=settings.api_max_header_bytes,
        limit_concurrency=settings.api_max_connections, timeout_keep_alive=KEEP_ALIVE_S,
        server_header=False,
    )


def listening_socket(*, host: str, port: int) -> socket.socket:
    """The API's socket, bound before uvicorn starts: a port in use is one line naming it (ServiceUnavailable),
    not uvicorn's six lines after "Application startup complete" and exit 3."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ServiceUnavailable(f"--host/--port: expected an address this process can listen on, got {host}:{port} "
                                 f"({error.strerror or error})") from None
    return sock


def serve(*, host: str, port: int, app: Any = "api.main:app") -> None:
    """Serve `app` (the API; `crucible rm serve` passes its own) on the bounded protocol."""
    sock = listening_socket(host=host, port=port)
    config = uvicorn_config(host=host, port=port, app=app)  # access lines masked by core.redact (?token=…)
    uvicorn.Server(config).run(sockets=[sock])
