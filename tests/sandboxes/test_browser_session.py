"""BrowserSession's start against a scripted driver stream: a driver whose Chromium answered late once is
asked again; a second fault, or a driver that died, is final. (The real driver in a real sandbox:
test_browser_isolation.py and the browser episode tests.)"""

from __future__ import annotations

import json

import pytest

from sandboxes.browser import BrowserFault, BrowserSession
from sandboxes.stream import StreamClosed


class ScriptedStream:
    """The driver's side of the exec stream: each request gets the next scripted reply (None: hang up)."""

    def __init__(self, replies: list[dict | None]) -> None:
        self.replies, self.requests = replies, []
        self.buffer, self.stderr, self.eof = b"", bytearray(), False

    def send(self, data: bytes) -> None:
        request = json.loads(data)
        self.requests.append(request["op"])
        reply = self.replies.pop(0)
        if reply is None:
            self.eof = True
            return
        self.buffer += json.dumps({"id": request["id"], **reply}).encode() + b"\n"

    def read_until(self, marker: bytes, *, deadline: float, start: int = 0) -> int:
        if marker not in self.buffer:
            raise StreamClosed("the driver exited")
        return self.buffer.index(marker) + 1

    def take(self, n: int) -> bytes:
        line, self.buffer = self.buffer[:n], self.buffer[n:]
        return line

    def close(self) -> None:
        self.eof = True


SLOW = {"fault": "CdpError: Browser.getVersion: no answer in 30 s"}
HELLO = {"ok": True, "protocol": 1, "chromium": "Chromium/156"}


def test_a_driver_whose_chromium_answered_late_is_asked_once_more() -> None:
    stream = ScriptedStream([SLOW, HELLO])
    session = BrowserSession(lambda argv: stream)  # type: ignore[arg-type, return-value]
    assert session.start()["chromium"] == "Chromium/156"
    assert stream.requests == ["hello", "hello"]


def test_a_second_fault_is_final() -> None:
    stream = ScriptedStream([SLOW, SLOW, HELLO])
    with pytest.raises(BrowserFault, match="no answer in 30 s"):
        BrowserSession(lambda argv: stream).start()  # type: ignore[arg-type, return-value]
    assert stream.requests == ["hello", "hello"]


def test_a_driver_that_died_is_not_asked_again() -> None:
    stream = ScriptedStream([None, HELLO])
    with pytest.raises(BrowserFault, match="driver exited"):
        BrowserSession(lambda argv: stream).start()  # type: ignore[arg-type, return-value]
    assert stream.requests == ["hello"]
