"""Settings fail fast with one readable line: the setting, what is expected, what was given."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from core.settings import load_settings


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("database_url", "mysql://root@localhost/db", "CRUCIBLE_DATABASE_URL: expected a postgresql:// URL, got 'mysql://root@localhost/db'"),
        ("database_url", "not a url", "CRUCIBLE_DATABASE_URL: expected a URL like postgresql://user@host:5432/dbname, got 'not a url'"),
        ("broker_url", "kafka://x", "CRUCIBLE_BROKER_URL: expected a URL starting with one of"),
        ("policy_url", "localhost:8000", "CRUCIBLE_POLICY_URL: expected an http:// or https:// URL, got 'localhost:8000'"),
        ("worker_concurrency", -1, "CRUCIBLE_WORKER_CONCURRENCY: Input should be greater than or equal to 1, got -1"),
        ("sandbox_pool_min", -3, "CRUCIBLE_SANDBOX_POOL_MIN: Input should be greater than or equal to 0, got -3"),
        ("worker_control_address", "0.0.0.0:8090", "CRUCIBLE_WORKER_CONTROL_ADDRESS: expected the host's own"),
        ("worker_control_address", "10.0.0.2", "CRUCIBLE_WORKER_CONTROL_ADDRESS: expected host:port"),
        ("worker_control_address", "h:99999", "CRUCIBLE_WORKER_CONTROL_ADDRESS: expected host:port"),
        ("image_registry", "http://r:5000", "CRUCIBLE_IMAGE_REGISTRY: expected a registry address"),
    ],
)
def test_bad_values_name_the_setting_and_the_value(field: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(**{field: value})
    assert str(caught.value).startswith(expected)
    assert "\n" not in str(caught.value)


def test_pool_max_below_min_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"CRUCIBLE_SANDBOX_POOL_MAX: expected at least CRUCIBLE_SANDBOX_POOL_MIN \(5\), got 2"):
        load_settings(sandbox_pool_min=5, sandbox_pool_max=2)


def test_postgres_urls_are_normalised_to_psycopg3() -> None:
    settings = load_settings(database_url="postgresql://u:p@db:5432/crucible")
    assert settings.database_url == "postgresql+psycopg://u:p@db:5432/crucible"


def test_unset_database_means_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRUCIBLE_DATABASE_URL", raising=False)
    assert load_settings().uses_embedded_database


def test_sandbox_networks_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRUCIBLE_SANDBOX_NETWORKS", " lab , eval,, ")
    assert load_settings().sandbox_networks == ["lab", "eval"]
    monkeypatch.delenv("CRUCIBLE_SANDBOX_NETWORKS")
    assert load_settings().sandbox_networks == []


def test_production_refuses_debug_logging() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environment="production", log_level="DEBUG")
    assert str(caught.value) == "CRUCIBLE_LOG_LEVEL: expected INFO or higher in production (no debug output), got 'DEBUG'"
    assert load_settings(environment="production", log_level="INFO").environment == "production"


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("policy_urls", "http://a:1/v1,ftp://b", "expected http:// or https:// URLs of at most"),
    ("policy_urls", "http://a:1/v1, http://A:1/v1/", "expected each server once"),
    ("policy_urls", " , ", "expected one or more comma-separated"),
    ("reward_servers", "http://judge:8001/v1,file:///etc/passwd", "expected http:// or https:// URLs of at most"),
    ("reward_servers", "x" * 600_000, "comma-separated (600000 characters given)"),
])
def test_url_lists_are_split_and_checked_alike(
    monkeypatch: pytest.MonkeyPatch, field: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(f"CRUCIBLE_{field.upper()}", value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert f"CRUCIBLE_{field.upper()}" in str(caught.value) and expected in str(caught.value)


def test_reward_servers_are_a_comma_separated_list_of_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRUCIBLE_REWARD_SERVERS", " http://judge:8001/v1/ ,http://rm:8002/v1,http://rm:8002/v1")
    settings = load_settings()
    assert settings.reward_servers == ["http://judge:8001/v1", "http://rm:8002/v1", "http://rm:8002/v1"]
    assert settings.allows_reward_server("http://JUDGE:8001") and not settings.allows_reward_server("http://x:1/v1")
