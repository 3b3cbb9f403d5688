"""Token service and `crucible token create|ls|revoke` (which talk to the database directly)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from api.services.tokens import Unauthorized, authenticate, create_token, list_tokens, revoke_token
from cli import tokens
from core.errors import ConfigError, NotFound

runner = CliRunner()


def test_create_authenticate_revoke(db_session: Session) -> None:
    row, token = create_token(db_session, name="ci")
    assert token.startswith("cru_") and row.prefix == token[:10]
    assert authenticate(db_session, token=token).id == row.id
    assert revoke_token(db_session, ref=row.prefix).revoked_at is not None
    with pytest.raises(Unauthorized, match="was revoked"):
        authenticate(db_session, token=token)
    revoke_token(db_session, ref=str(row.id))  # idempotent


def test_authenticate_says_why(db_session: Session) -> None:
    with pytest.raises(Unauthorized, match=r"expected an `Authorization: Bearer <token>` header, got none"):
        authenticate(db_session, token=None)
    with pytest.raises(Unauthorized, match=r"got an unknown one \('cru_abc'…\)"):
        authenticate(db_session, token="cru_abc")


def test_revoke_by_a_name_two_live_tokens_share_is_ambiguous(db_session: Session) -> None:
    create_token(db_session, name="shared")
    create_token(db_session, name="shared")
    with pytest.raises(ConfigError, match=r"'shared' names 2 live tokens \(ids 1, 2\); expected one, revoke by id"):
        revoke_token(db_session, ref="shared")
    with pytest.raises(NotFound, match="no token with id, name or prefix 'ghost'"):
        revoke_token(db_session, ref="ghost")
    with pytest.raises(ConfigError, match="name: expected 1 to 128 characters"):
        create_token(db_session, name="  ")


def test_cli_prints_the_token_once_and_lists_only_prefixes(db_session: Session) -> None:
    created = runner.invoke(tokens.app, ["create", "laptop", "-o", "json"])
    assert created.exit_code == 0, created.output
    token = json.loads(created.output)["token"]
    listed = runner.invoke(tokens.app, ["ls"])
    assert listed.exit_code == 0 and "laptop" in listed.output and token not in listed.output
    as_json = json.loads(runner.invoke(tokens.app, ["ls", "-o", "json"]).output)
    assert [(t["name"], t["revoked_at"]) for t in as_json] == [("laptop", None)]
    revoked = runner.invoke(tokens.app, ["revoke", "laptop"])
    assert revoked.exit_code == 0 and "revoked token 1 (laptop" in revoked.output
    db_session.expire_all()
    assert list_tokens(db_session, include_revoked=False) == []


def test_cli_errors_are_one_line(db_session: Session) -> None:
    result = runner.invoke(tokens.app, ["revoke", "nobody"])
    assert result.exit_code == 2
    assert "error: no token with id, name or prefix 'nobody'" in result.output
    assert "Traceback" not in result.output
