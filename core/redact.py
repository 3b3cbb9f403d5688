"""No secret in any log line: credentials in URLs, `?token=` query values and the process's own
secrets are masked in every line, whoever logs it (httpx's request lines, uvicorn, Celery, ours).

    install(secrets)     # once per process, after logging is configured (cli/main.py does it)
    mask("http://u:pw@h/v1?token=t")  → "http://***@h/v1?token=***"

`install` masks what `logging.Formatter.format` returns. Every handler formats through it (each
library's own formatter subclasses it, and a handler without one uses logging's default), so the
message with its arguments — an httpx URL object included —, the traceback and the stack are masked
together, after formatting, where no spelling of an argument can slip past.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable

# scheme://userinfo@ — userinfo runs up to the last '@' before the authority ends ('/', '?', '#', space).
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^\s/?#]*@)")
# ?token=… (a dashboard link, an old client): the value up to the next parameter.
_SECRET_PARAM = re.compile(r"(?i)(?P<key>[?&](?:token|access_token|api_token|api_key|password)=)[^&\s\"']*")
MASK = "***"

_known: set[str] = set()
_lock = threading.Lock()
_original_format: Callable[[logging.Formatter, logging.LogRecord], str] | None = None


def add_secrets(values: Iterable[str | None]) -> None:
    """Also mask these exact strings (API tokens, passwords given apart from a URL). Short values are
    not secrets worth masking and would mask common words: at least 8 characters."""
    with _lock:
        _known.update(value for value in values if value and len(value) >= 8)


def mask(text: str) -> str:
    masked = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    masked = _SECRET_PARAM.sub(lambda m: f"{m['key']}{MASK}", masked)
    for secret in sorted(_known, key=len, reverse=True):  # a longer secret before one it contains
        masked = masked.replace(secret, MASK)
    return masked


def install(secrets: Iterable[str | None] = ()) -> None:
    """Mask every log line this process formats from now on (idempotent; more secrets may be added)."""
    global _original_format
    add_secrets(secrets)
    with _lock:
        if _original_format is not None:
            return
        original = _original_format = logging.Formatter.format

    def format(self: logging.Formatter, record: logging.LogRecord) -> str:
        return mask(original(self, record))

    logging.Formatter.format = format  # type: ignore[method-assign]


def uninstall() -> None:
    """Undo `install` (tests)."""
    global _original_format
    with _lock:
        if _original_format is not None:
            logging.Formatter.format = _original_format  # type: ignore[method-assign,assignment]
            _original_format = None


def settings_secrets() -> list[str | None]:
    """The secrets in Crucible's settings: the API token and the password of every URL they hold."""
    from urllib.parse import urlsplit

    from core.settings import get_settings

    settings = get_settings()
    urls = [settings.database_url, settings.broker_url, settings.policy_url, settings.api_url,
            *(settings.policy_urls or [])]
    passwords: list[str | None] = []
    for url in urls:
        try:
            passwords.append(urlsplit(url).password if url else None)
        except ValueError:  # not a URL a password can be read from: the userinfo rule still masks it
            continue
    return [settings.api_token, *passwords]
