"""API tokens, checked: the one check of a bearer token, for the API and for every service that takes the
API's tokens (a worker's sandbox control service, task_workers/control.py). Creating, listing and
revoking them: api/services/tokens.py."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from core.errors import CrucibleError
from core.models import ApiToken

SHOWN_PREFIX_LENGTH = 10
LAST_USED_RESOLUTION = timedelta(minutes=1)
"""`last_used_at` is written at most once a minute per token, so reads stay reads."""


class Unauthorized(CrucibleError):
    """No token, an unknown token or a revoked one."""


def hash_token(token: str) -> str:
    # surrogatepass: a lone surrogate (from a form field) is an unknown token, not an encoding crash
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def authenticate(session: Session, *, token: str | None) -> ApiToken:
    """The live token row for `token`; Unauthorized with the reason otherwise."""
    if not token:
        raise Unauthorized("expected an `Authorization: Bearer <token>` header, got none; "
                           "create a token with `crucible token create NAME`")
    row = session.execute(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).scalar_one_or_none()
    if row is None:
        raise Unauthorized(f"expected a valid API token, got an unknown one ({token[:SHOWN_PREFIX_LENGTH]!r}…)")
    if row.revoked_at is not None:
        raise Unauthorized(f"token {row.prefix!r}… ({row.name}) was revoked at {row.revoked_at:%Y-%m-%d %H:%M} UTC")
    now = datetime.now(UTC)
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        session.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
        row.last_used_at = now
    return row
