"""API test fixtures: the app, a live token, clients with and without it, and the seeded demo run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.main import create_app
from api.services.tokens import create_token
from cli.api_client import use_http_client
from core.settings import get_settings
from tests.api.trajectories import SeededRun, seed_demo_run, write_tokenizer


@pytest.fixture(scope="session")
def app() -> FastAPI:
    return create_app()


@pytest.fixture
def token(db_session: Session) -> str:
    _, plaintext = create_token(db_session, name="tests")
    db_session.commit()
    return plaintext


@pytest.fixture
def client(app: FastAPI, token: str) -> Iterator[TestClient]:
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


@pytest.fixture
def anonymous(app: FastAPI, db_session: Session) -> Iterator[TestClient]:
    with TestClient(app) as client:
        yield client


@pytest.fixture
def seeded(db_session: Session, tmp_path: Path) -> SeededRun:
    return seed_demo_run(db_session, model_dir=write_tokenizer(tmp_path / "model"))


@pytest.fixture
def cli_env(app: FastAPI, token: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CLI's settings carry the token; its HTTP calls go to the app in this process."""
    monkeypatch.setenv("CRUCIBLE_API_TOKEN", token)
    monkeypatch.setenv("CRUCIBLE_API_URL", "http://crucible.test:8080")
    get_settings.cache_clear()
    with TestClient(app) as http, use_http_client(http):
        yield
    monkeypatch.undo()
    get_settings.cache_clear()
