"""Limits on every input, enforced before work, answered in the one error shape (issue 11):
request heads and bodies (a real `crucible api`, its memory measured), JSON depth, lone surrogates in
bodies and cursors, and a value Postgres refuses for its size."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from api.errors import _operational_error
from tests.api.live_server import LiveApi, live_api

MIB = 2**20
MEMORY_BOUND_KIB = 40 * 1024
"""What a refused 50 MB head or 300 MB body may add to the API's peak RSS (it used to add the whole input)."""


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}
    return body["error"]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [300, 1000, 100_000])
def test_deeply_nested_json_is_a_4xx(client: TestClient, depth: int) -> None:
    for path, body in (("/v1/environments", '{"name": "deep", "kind": "code_repo", "sandbox": {"env": %s}}'),
                       ("/v1/runs", '{"name": "deep", "model": "m", "environments": %s}')):
        response = client.post(path, content=(body % _nested(depth)).encode(), headers={"content-type": "application/json"})
        error = _error(response, 422)
        assert error["code"] == "limit_exceeded" and "expected" in error["message"] and "deep" in error["message"]


@pytest.mark.parametrize("content_type", ["", "application/merge-patch+json", "application/json; charset=utf-8"])
def test_every_body_fastapi_reads_as_json_is_checked(client: TestClient, content_type: str) -> None:
    body = ('{"name": "deep", "kind": "code_repo", "sandbox": {"env": ' + _nested(1000) + "}}").encode()
    headers = {"content-type": content_type} if content_type else {}
    request = client.build_request("POST", "/v1/environments", content=body, headers=headers)
    assert request.headers.get("content-type", "") == content_type  # none at all is read as JSON too
    assert _error(client.send(request), 422)["code"] == "limit_exceeded"


@pytest.mark.parametrize("raw", [b'"a\\ud800b"', b'"\\udfff"', b'"\xed\xa0\x80"'])
def test_a_lone_surrogate_in_a_body_is_a_4xx(client: TestClient, raw: bytes) -> None:
    body = b'{"name": "sur", "kind": "code_repo", "description": ' + raw + b"}"
    error = _error(client.post("/v1/environments", content=body, headers={"content-type": "application/json"}), 422)
    assert "description: expected text, got a lone UTF-16 surrogate" in error["message"]
    assert client.get("/v1/environments").json()["data"] == []


@pytest.mark.parametrize("key", [["\ud800"], ["a\x00"], ["x" * 10_000], [[[[]]]]])
def test_a_forged_cursor_with_odd_strings_is_a_4xx(client: TestClient, key: list) -> None:
    raw = json.dumps(key).encode()  # ensure_ascii: the surrogate travels as the escape \ud800
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")[:512]
    for path in ("/v1/environments", "/v1/tasks", "/v1/episodes"):
        assert _error(client.get(path, params={"cursor": cursor}), 422)["code"] == "invalid_cursor"


def test_a_json_body_over_the_limit_is_413_unread(client: TestClient) -> None:
    big = json.dumps({"name": "big", "kind": "code_repo", "description": "x" * (2 * MIB)})
    error = _error(client.post("/v1/environments", content=big, headers={"content-type": "application/json"}), 413)
    assert error["code"] == "too_large" and error["message"].startswith(f"body: expected at most {MIB} bytes")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the middleware counts as it streams
        yield big.encode()

    assert _error(client.post("/v1/runs", content=chunks(), headers={"content-type": "application/json"}), 413)


def test_a_database_size_limit_says_what_failed(db_session: Session) -> None:
    """A value Postgres refuses for its size (SQLSTATE class 54, here a tsvector over 1 MB, as a huge
    turn's search column would be) used to be answered 503 "the database does not answer"."""
    too_long = "SELECT to_tsvector('simple', string_agg(md5(i::text), ' ')) FROM generate_series(1, 40000) i"
    with pytest.raises(OperationalError) as caught:
        db_session.execute(text(too_long))
    db_session.rollback()
    import asyncio

    response = asyncio.run(_operational_error(None, caught.value))  # type: ignore[arg-type]
    body = json.loads(response.body)
    assert response.status_code == 422 and body["error"]["code"] == "too_large"
    assert body["error"]["message"].startswith("the database refused a value as too large: string is too long for tsvector")


# --- a real `crucible api` ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    with live_api(tmp_path_factory.mktemp("api")) as api:
        yield api


def _send_until_answered(port: int, head: bytes, body_chunks: Iterator[bytes]) -> bytes:
    """Send `head` then chunks, reading whatever the server answers while we still send."""
    answer = bytearray()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        done = threading.Event()

        def read() -> None:
            try:
                while chunk := sock.recv(65536):
                    answer.extend(chunk)
                    if b"\r\n\r\n" in answer:
                        done.set()
            except OSError:
                pass
            done.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            sock.sendall(head)
            for chunk in body_chunks:
                if done.is_set():
                    break
                sock.sendall(chunk)
        except OSError:
            pass  # the server closed on us: what it said first is in `answer`
        done.wait(timeout=60)
    return bytes(answer)


def _status_and_error(answer: bytes) -> tuple[int, dict]:
    """Status and error body; the body is {} when it never arrived: a server that closes a socket the
    client is still writing to resets it, and the reset can discard the body (the head came first)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body[: body.rindex(b"}") + 1])["error"] if b"}" in body else {}


def test_a_50_mb_header_is_431_with_memory_flat(server: LiveApi) -> None:
    baseline = server.memory_kib("VmHWM")
    head = b"GET /v1/runs HTTP/1.1\r\nHost: x\r\nX-Big: "
    for _attempt in range(3):  # the body can be lost to the reset (see _status_and_error): ask again
        status, error = _status_and_error(_send_until_answered(server.port, head, (b"a" * MIB for _ in range(50))))
        assert status == 431
        if error:
            break
    assert error["code"] == "request_header_fields_too_large"
    assert error["message"] == "request head: expected at most 65536 bytes of request line and headers, got more"
    assert server.memory_kib("VmHWM") - baseline < MEMORY_BOUND_KIB
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # nobody else is stalled


@pytest.mark.parametrize("declared", [True, False])
def test_a_300_mb_body_is_413_with_memory_flat(server: LiveApi, declared: bool) -> None:
    baseline = server.memory_kib("VmHWM")
    framing = b"Content-Length: %d\r\n" % (300 * MIB) if declared else b"Transfer-Encoding: chunked\r\n"
    head = b"POST /v1/environments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + framing + b"\r\n"
    chunk = b"a" * MIB if declared else b"%x\r\n%s\r\n" % (MIB, b"a" * MIB)
    status, error = _status_and_error(_send_until_answered(server.port, head, (chunk for _ in range(300))))
    # The one error shape of a 413 is checked on a body small enough to arrive whole (the next test).
    assert status == 413 and error.get("code", "too_large") == "too_large"
    assert server.memory_kib("VmHWM") - baseline < MEMORY_BOUND_KIB
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_an_oversized_head_and_body_are_refused_without_a_token(server: LiveApi) -> None:
    """The limits act before authentication: a stranger cannot make the server hold anything."""
    response = httpx.post(f"{server.url}/v1/runs", content=b"x" * (2 * MIB), headers={"content-type": "application/json"})
    assert _error(response, 413)["code"] == "too_large"
    nested = httpx.post(f"{server.url}/v1/runs", content=_nested(1000).encode(), headers={"content-type": "application/json"})
    assert _error(nested, 422)["code"] == "limit_exceeded"


def test_the_server_runs_on_the_bounded_protocol(tmp_path: Path) -> None:
    """The bounds come from `api.server`, not from uvicorn's defaults (httptools has no head limit)."""
    from api.server import BoundedH11Protocol, uvicorn_config

    config = uvicorn_config(host="127.0.0.1", port=1)
    assert config.http is BoundedH11Protocol and config.h11_max_incomplete_event_size == 64 * 1024
    assert config.limit_concurrency == 256


def _open_from(address: str, port: int) -> socket.socket:
    """A connection to the API from another loopback address (127.0.0.0/8 is all this machine's)."""
    sock = socket.socket()
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_slowloris_from_one_address_starves_nobody_and_its_sockets_are_closed(
    tmp_path: Path, db_session: Session
) -> None:
    """(issue 24) 300 half-open connections from one address, trickling a header byte every 0.5 s, and
    silent ones beside them. The address holds at most its share of connections (the rest are closed at
    once); an authenticated client elsewhere gets every answer meanwhile; every attacking socket is
    closed by its head deadline, the silent ones included."""
    import time

    from api.services.tokens import create_token

    _, token = create_token(db_session, name="slowloris")
    db_session.commit()
    with live_api(tmp_path, api_head_timeout_s="2", api_max_client_connections="16") as api:
        attackers = [_open_from("127.0.0.2", api.port) for _ in range(300)]
        silent = [_open_from("127.0.0.3", api.port) for _ in range(3)]
        for sock in attackers:
            with contextlib.suppress(OSError):  # closed at once: over the address's share
                sock.send(b"GET /v1/runs HTTP/1.1\r\nHost: x\r\nX-a: ")
        statuses = []
        started = time.monotonic()
        with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
            while time.monotonic() - started < 4:  # the attack's window: counted answers, not timed ones
                for sock in attackers:
                    with contextlib.suppress(OSError):
                        sock.send(b"a")
                statuses.append(client.get("/v1/runs").status_code)
                time.sleep(0.5)
        assert statuses and set(statuses) == {200}, statuses
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(_closed_by_server(s) for s in attackers + silent):
            time.sleep(0.2)
        still_open = sum(not _closed_by_server(sock) for sock in attackers + silent)
        for sock in attackers + silent:
            sock.close()
        assert still_open == 0
        log = api.log_text()
    assert "CRUCIBLE_API_MAX_CLIENT_CONNECTIONS" in log and "its request head took over 2 s" in log


@pytest.mark.parametrize("size", [100_000, 65_600])
def test_one_large_header_sent_whole_is_431(server: LiveApi, size: int) -> None:
    """(issue 24) h11 bounds only what it buffers before a head completes: a 100 KB header that arrived in
    one piece, its blank line with it, went through. The head's own size is checked once it is parsed."""
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert httpx.get(f"{server.url}/healthz").status_code == 200
