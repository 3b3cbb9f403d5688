"""API tokens: create (shown once), list, revoke, authenticate. Only a SHA-256 hash is stored."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from core.errors import ConfigError, NotFound
from core.models import ApiToken, DashboardSession
from core.tokens import SHOWN_PREFIX_LENGTH, Unauthorized, authenticate, hash_token

__all__ = ["Unauthorized", "authenticate", "close_session", "create_token", "hash_token", "list_tokens",
           "open_session", "revoke_token", "session_token"]

TOKEN_PREFIX = "cru_"


def create_token(session: Session, *, name: str) -> tuple[ApiToken, str]:
    """A new token named `name`; returns the row and the token itself (never stored)."""
    name = name.strip()
    if not name or len(name) > 128:
        raise ConfigError(f"name: expected 1 to 128 characters, got {name!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, token_hash=hash_token(token), prefix=token[:SHOWN_PREFIX_LENGTH])
    session.add(row)
    session.flush()
    return row, token


def list_tokens(session: Session, *, include_revoked: bool = True) -> list[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return list(session.execute(query).scalars())


def revoke_token(session: Session, *, ref: str) -> ApiToken:
    """Revoke by id, name or shown prefix. Idempotent; a name shared by live tokens is ambiguous."""
    query = select(ApiToken)
    if ref.isdigit():
        query = query.where(ApiToken.id == int(ref))
    else:
        query = query.where((ApiToken.name == ref) | (ApiToken.prefix == ref))
    rows = list(session.execute(query.order_by(ApiToken.id)).scalars())
    live = [row for row in rows if row.revoked_at is None]
    if not rows:
        raise NotFound(f"no token with id, name or prefix {ref!r}; `crucible token ls` lists them")
    if len(live) > 1:
        ids = ", ".join(str(row.id) for row in live)
        raise ConfigError(f"{ref!r} names {len(live)} live tokens (ids {ids}); expected one, revoke by id")
    row = live[0] if live else rows[0]
    if row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
        session.flush()
    return row


SESSION_PREFIX = "ses_"


def open_session(session: Session, *, token: ApiToken, max_age_s: int) -> str:
    """A dashboard session for `token`: the secret the cookie holds (its hash is stored, as a token's)."""
    secret = SESSION_PREFIX + secrets.token_urlsafe(32)
    session.add(DashboardSession(token_id=token.id, secret_hash=hash_token(secret),
                                 expires_at=datetime.now(UTC) + timedelta(seconds=max_age_s)))
    session.flush()
    return secret


def session_token(session: Session, *, secret: str | None) -> ApiToken:
    """The live token behind a dashboard cookie; Unauthorized with the reason otherwise (signed out,
    expired, its token revoked, or not a session this server made)."""
    if not secret:
        raise Unauthorized("expected to be signed in (the dashboard's cookie) or an `Authorization: Bearer <token>` "
                           "header, got neither; create a token with `crucible token create NAME`")
    row = session.execute(select(DashboardSession).where(DashboardSession.secret_hash == hash_token(secret))
                          ).scalar_one_or_none()
    if row is None:
        raise Unauthorized("expected a dashboard session of this server, got an unknown one: sign in again")
    if row.revoked_at is not None:
        raise Unauthorized("this dashboard session was signed out: sign in again")
    if row.expires_at <= datetime.now(UTC):
        raise Unauthorized("this dashboard session expired: sign in again")
    token = session.get(ApiToken, row.token_id)
    if token is None or token.revoked_at is not None:
        raise Unauthorized("the token this dashboard session signed in with was revoked: sign in with a live one")
    return token


def close_session(session: Session, *, secret: str | None) -> None:
    """/logout: the session behind this cookie is revoked (a copy of the cookie signs no one in)."""
    if secret:
        session.execute(update(DashboardSession).where(DashboardSession.secret_hash == hash_token(secret),
                                                       DashboardSession.revoked_at.is_(None))
                        .values(revoked_at=datetime.now(UTC)))
