"""core.redact: no credential survives into a log record, however it is spelled or whoever logs it."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import httpx
import pytest

from core import redact

PASSWORD = "pw-S3cret@and%2Fmore:too"  # a raw "@" and ":" in it: what ends a naive match


@pytest.fixture
def masked() -> Iterator[io.StringIO]:
    """This process's lines masked (as every Crucible process's are), written to a buffer; undone after."""
    known = set(redact._known)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    level, root.level = root.level, logging.INFO
    redact.install(["tok_live_0123456789abcdef"])
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.level = level
        redact.uninstall()
        redact._known = known


@pytest.mark.parametrize(("text", "expected"), [
    ("http://user:hunter2@gpu0:8000/v1", "http://***@gpu0:8000/v1"),
    ("postgresql+psycopg://crucible:pa%40ss@db:5432/crucible", "postgresql+psycopg://***@db:5432/crucible"),
    ("redis://:only-a-password@cache:6379/0", "redis://***@cache:6379/0"),
    ("https://a-bare-token@host/x", "https://***@host/x"),
    ("amqp://u:p@ss@rabbit//", "amqp://***@rabbit//"),  # a raw '@' in the password: up to the last one
    ("two: http://a:b@h1/ and sqla+postgresql://c:d@h2/x.", "two: http://***@h1/ and sqla+postgresql://***@h2/x."),
    ("mail me at someone@example.com, see http://h/p@q", "mail me at someone@example.com, see http://h/p@q"),
    ('GET /runs/3?token=cru_abc&page=2 HTTP/1.1', 'GET /runs/3?token=***&page=2 HTTP/1.1'),
    ('"GET /?x=1&API_TOKEN=cru_abc" 200', '"GET /?x=1&API_TOKEN=***" 200'),
])
def test_userinfo_in_any_url_is_masked(text: str, expected: str) -> None:
    assert redact.mask(text) == expected


def test_a_record_is_masked_in_its_arguments_its_traceback_and_its_stack(masked: io.StringIO) -> None:
    log = logging.getLogger("crucible.test")
    url = f"http://user:{PASSWORD}@127.0.0.1:9/v1"
    log.info("policy at %s, token %s", url, "tok_live_0123456789abcdef")
    try:
        raise ConnectionError(f"cannot reach {url}")
    except ConnectionError:
        log.exception("failed")
    log.warning({"url": url}, stack_info=True)
    text = masked.getvalue()
    assert "S3cret" not in text and "more:too" not in text and "tok_live_0123456789abcdef" not in text, text
    assert "http://***@127.0.0.1:9/v1" in text and "ConnectionError: cannot reach http://***@" in text


def test_httpx_request_lines_carry_no_credentials(masked: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx logs `HTTP Request: GET http://user:password@…` at INFO: the line every policy call wrote."""
    httpx_log = logging.getLogger("httpx")
    # Whatever an earlier test or library set: a level, a disabled logger, logging.disable(…).
    monkeypatch.setattr(httpx_log, "level", logging.INFO)
    monkeypatch.setattr(httpx_log, "propagate", True)
    monkeypatch.setattr(httpx_log, "disabled", False)
    monkeypatch.setattr(logging.root.manager, "disable", logging.NOTSET)
    httpx_log.manager._clear_cache()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    with httpx.Client(transport=transport) as client:
        client.get(f"http://user:{PASSWORD}@policy.invalid:8000/v1/models")
    text = masked.getvalue()
    assert "HTTP Request: GET http://***@policy.invalid:8000/v1/models" in text, text
    assert "S3cret" not in text


def test_uvicorns_access_line_is_masked_and_still_formatted(masked: io.StringIO) -> None:
    """uvicorn's access formatter reads the record's arguments itself: masking the formatted line keeps it whole."""
    from uvicorn.logging import AccessFormatter

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', (
        "127.0.0.1:5", "GET", "/dashboard?token=cru_live_secret", "1.1", 200), None)
    line = AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False).format(record)
    assert line == '127.0.0.1:5 - "GET /dashboard?token=*** HTTP/1.1" 200 OK'


def test_short_values_are_not_taken_for_secrets() -> None:
    before = set(redact._known)
    try:
        redact.add_secrets(["", None, "abc"])
        assert redact._known == before
    finally:
        redact._known = before
