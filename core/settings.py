"""One validated Settings object, read from `CRUCIBLE_*` environment variables (and `.env`).

With no `CRUCIBLE_DATABASE_URL`, Crucible runs an embedded Postgres under the data dir; with no
`CRUCIBLE_BROKER_URL`, Celery uses its SQLAlchemy transport on that same database. A wrong value
fails fast with a `ConfigError` that names the setting, what was given and what is expected.
"""

from __future__ import annotations

import os
import re
import socket
import string
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from core.errors import ConfigError

ENV_PREFIX = "CRUCIBLE_"
BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps", "pyamqp", "sqla+postgresql", "memory")
MAX_POLICY_REPLICAS = 256
MAX_URL_CHARS = 2048


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "crucible"


def http_urls(value: list[str], *, unique: bool) -> list[str]:
    """Each an http(s) URL (trailing / dropped); with `unique`, no server twice however spelt."""
    urls: list[str] = []
    seen: dict[str, str] = {}
    for url in value:
        if not _is_http_url(url):
            raise ValueError(f"expected http:// or https:// URLs of at most {MAX_URL_CHARS} characters, "
                             f"not {_clip(url)}")
        url = url.rstrip("/")
        key = _server_key(url)
        if unique and key in seen:
            raise ValueError(f"expected each server once, {_clip(url)} repeats {_clip(seen[key])}")
        seen[key] = url
        urls.append(url)
    return urls



REGISTRY_ADDRESS = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


def control_address(value: str) -> tuple[str, int]:
    """`host:port` (`[v6]:port`) → (host, port); ValueError naming what was expected."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535 or not re.fullmatch(r"[A-Za-z0-9.:-]{1,253}", host):
        raise ValueError("expected host:port (e.g. 10.0.0.2:8090, or 127.0.0.1:0 for any free port)")
    if host in ("0.0.0.0", "::", "0", "*"):  # published as the URL others reach: an address, not "every one"
        raise ValueError("expected the host's own address (others reach the service by it), not an unspecified one")
    return host, int(port)


def registry_address(value: str) -> str:
    """A registry as Docker names one in an image reference: `host[:port][/path]`, no scheme, no tag."""
    if not REGISTRY_ADDRESS.fullmatch(value) or ("." not in value.split("/")[0] and ":" not in value.split("/")[0]
                                                 and value.split("/")[0] != "localhost"):
        raise ValueError("expected a registry address host:port[/path] (e.g. 10.0.0.1:5000)")
    return value


class Settings(BaseSettings):
    """Everything a Crucible process is configured by. Field docs are the configuration reference."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=".env", extra="ignore")

    database_url: str | None = None
    """PostgreSQL URL. Unset: an embedded Postgres is started under `data_dir/postgres`."""
    broker_url: str | None = None
    """Celery broker (redis://, amqp://). Unset: Celery's SQLAlchemy transport on the database."""
    policy_url: str = "http://127.0.0.1:8000/v1"
    """OpenAI-compatible policy server (vLLM) base URL. With CRUCIBLE_POLICY_URLS and this unset: the
    first of those (the trainer syncs weights to every one of them: trainer/sync.py)."""
    policy_urls: Annotated[list[str] | None, NoDecode] = None
    """Comma-separated policy servers (vLLM replicas of one model) that workers share episodes among,
    each episode on one replica (task_workers/policy/pool.py). Unset: CRUCIBLE_POLICY_URL alone."""
    policy_tokenizer: Path | None = None
    """The served model's directory: workers tokenize environment text with it locally (else over HTTP)."""
    data_dir: Path = Field(default_factory=_default_data_dir)
    """Where the embedded database, checkpoints, models and image caches live."""
    archive_dir: Path | None = None
    """Where `crucible runs archive` writes archived runs' turns (Parquet) and the API reads them: one
    directory every API host mounts at this path. Unset: `data_dir/archive`."""
    api_url: str = "http://127.0.0.1:8080"
    """Where the REST API and dashboard are served; the CLI talks to it."""
    api_token: str | None = None
    """Bearer token the CLI sends to the API."""
    environment: Literal["development", "production"] = "development"
    """`production`: the API refuses to start unless CRUCIBLE_API_TOKEN names a live token, the dashboard
    cookie is always `Secure`, DEBUG logging is refused and error answers carry no internals."""
    api_max_header_bytes: Annotated[int, Field(ge=4096, le=2**24)] = 64 * 2**10
    """Request line plus headers of one request (`crucible api`); a larger one is answered 431."""
    api_max_body_bytes: Annotated[int, Field(ge=4096, le=2**30)] = 2**20
    """A request body the API parses in memory (JSON, forms); a larger one is answered 413 unread."""
    api_max_upload_bytes: Annotated[int, Field(ge=4096, le=2**33)] = 64 * 2**20
    """A task upload (streamed to disk as it arrives); a larger one is answered 413."""
    api_max_connections: Annotated[int, Field(ge=1, le=65536)] = 256
    """Connections `crucible api` serves at once; beyond it a request is answered 503 at once."""
    api_max_client_connections: Annotated[int, Field(ge=1, le=65536)] = 32
    """Connections one client address may hold open at once; beyond it a new one is closed at once, so one
    client cannot take every connection (300 half-open sockets made every client get 503)."""
    api_head_timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    """Time a connection has to send a request's line and headers once it starts one (or opens)."""
    api_body_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    """Time a request has to send its whole body once its head is in."""
    task_repos_root: Path | None = None
    """The one server directory under which `POST …/tasks?format=swebench&repos_dir=` may name
    repositories. Unset: the API reads no server path at all (upload archives instead)."""
    sandbox_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated Docker networks an environment spec may name (with `allow_network`). Empty: none."""
    reward_servers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated servers an environment spec may name as its judge or reward model (workers post
    every episode there). The policy servers are always allowed; anything else only if listed here."""
    policy_servers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated policy servers a run may name as its own pool (`policy_urls`), besides the
    platform's (CRUCIBLE_POLICY_URLS): workers sample from them and its trainer pushes to them."""
    worker_name: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """Identity of this worker; it labels every sandbox the worker owns."""
    worker_concurrency: Annotated[int, Field(ge=1, le=1024)] = 4
    """Episodes a task worker runs at once (threads)."""
    sandbox_base_image: str | None = None
    """A registry image to build environments on instead of the debootstrap base."""
    worker_control_address: str = "127.0.0.1:0"
    """Where a worker's sandbox control service listens (`host:port`; port 0: any free one), the address the
    API reaches it by, so give a worker host's own address in a fleet; `off`: no service
    (task_workers/control.py)."""
    image_registry: str | None = None
    """Where `crucible images push` puts the sandbox images (`host:port`, or `host:port/prefix`), for worker
    hosts that never built them to pull by digest (environments/images/registry.py)."""
    sandbox_pool_min: Annotated[int, Field(ge=0, le=1024)] = 1
    """Warm sandboxes kept ready per spec."""
    sandbox_pool_max: Annotated[int, Field(ge=1, le=1024)] = 8
    """Most sandboxes one worker holds per spec."""
    db_pool_size: Annotated[int, Field(ge=1, le=512)] = 10
    """SQLAlchemy connection pool size per process."""
    db_connect_timeout_s: Annotated[int, Field(ge=1, le=600)] = 5
    """Seconds to wait for the database before failing."""
    db_outage_s: Annotated[int, Field(ge=1, le=86400)] = 300
    """Seconds the trainer waits out a lost database (retrying on new connections) before it gives up."""
    trainer_rank_timeout_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 600
    """Seconds a trainer rank waits in a collective for the others (a rank that died is noticed)."""
    peak_flops: Annotated[float | None, Field(gt=0, allow_inf_nan=False)] = None
    """The accelerator's peak FLOP/s, for the MFU (`cost/mfu`). Unset: trainer/cost.py's table by device
    name (none on CPU)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Logging level for every Crucible process."""

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        return str(_postgres_url(value).render_as_string(hide_password=False))

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if not scheme.startswith(BROKER_SCHEMES):
            raise ValueError(f"expected a URL starting with one of {', '.join(BROKER_SCHEMES)}")
        return value

    @field_validator("policy_url", "api_url")
    @classmethod
    def _check_http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
            raise ValueError("expected an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("policy_urls", "reward_servers", "policy_servers", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        if isinstance(value, str):
            if len(value) > MAX_POLICY_REPLICAS * (MAX_URL_CHARS + 1):
                raise ValueError(f"expected at most {MAX_POLICY_REPLICAS} URLs of {MAX_URL_CHARS} characters, "
                                 f"comma-separated ({len(value)} characters given)")
            return [url.strip() for url in value.split(",") if url.strip()]
        return value

    @field_validator("policy_urls")
    @classmethod
    def _check_policy_urls(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("expected one or more comma-separated http:// or https:// URLs")
        if len(value) > MAX_POLICY_REPLICAS:
            raise ValueError(f"expected at most {MAX_POLICY_REPLICAS} URLs ({len(value)} given)")
        return http_urls(value, unique=True)

    @model_validator(mode="after")
    def _policy_url_from_pool(self) -> Settings:
        if self.policy_urls and "policy_url" not in self.model_fields_set:
            self.policy_url = self.policy_urls[0]
        return self

    @property
    def policy_pool(self) -> list[str]:
        """The policy servers workers use: CRUCIBLE_POLICY_URLS, else CRUCIBLE_POLICY_URL alone."""
        return list(self.policy_urls) if self.policy_urls else [self.policy_url]

    @field_validator("worker_control_address")
    @classmethod
    def _check_control_address(cls, value: str) -> str:
        if value != "off":
            control_address(value)
        return value

    @field_validator("image_registry")
    @classmethod
    def _check_registry(cls, value: str | None) -> str | None:
        return None if value is None else registry_address(value)

    @field_validator("sandbox_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("reward_servers", "policy_servers")
    @classmethod
    def _check_reward_servers(cls, value: list[str]) -> list[str]:
        return http_urls(value, unique=False)

    def allows_policy_server(self, url: str) -> bool:
        """Whether a run may name `url` as one of its own policy servers: the platform's or a listed one
        (the same server however spelt)."""
        return _is_http_url(url) and _server_key(url) in {_server_key(u) for u in [*self.policy_pool,
                                                                                     *self.policy_servers]}

    def allows_reward_server(self, url: str) -> bool:
        """Whether a spec may name `url` as its judge or reward model: a policy server or a listed one
        (the same server however spelt: case of the host, default port, a trailing /v1)."""
        if not _is_http_url(url):
            return False
        return _server_key(url) in {_server_key(u) for u in [*self.policy_pool, *self.reward_servers]}

    @model_validator(mode="after")
    def _production_rules(self) -> Settings:
        if self.environment == "production" and self.log_level == "DEBUG":
            raise ValueError("CRUCIBLE_LOG_LEVEL: expected INFO or higher in production (no debug output), got 'DEBUG'")
        return self

    @field_validator("sandbox_pool_max")
    @classmethod
    def _check_pool_bounds(cls, value: int, info) -> int:  # type: ignore[no-untyped-def]
        low = info.data.get("sandbox_pool_min")
        if low is not None and value < low:
            raise ValueError(f"expected at least CRUCIBLE_SANDBOX_POOL_MIN ({low})")
        return value

    @property
    def uses_embedded_database(self) -> bool:
        return self.database_url is None


def _postgres_url(value: str) -> URL:
    """Parse and normalise a PostgreSQL URL to the psycopg 3 driver."""
    try:
        url = make_url(value)
    except ArgumentError:
        raise ValueError("expected a URL like postgresql://user@host:5432/dbname") from None
    if url.get_backend_name() != "postgresql":
        raise ValueError("expected a postgresql:// URL")
    if url.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def _is_http_url(value: str) -> bool:
    if len(value) > MAX_URL_CHARS or not value.startswith(("http://", "https://")):
        return False
    if any(char in value for char in string.whitespace) or not value.isprintable():
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        return False
    return bool(parts.hostname)


def public_url(url: str) -> str:
    """`url` without credentials, query or fragment: how a policy replica is named in turns and reports."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def same_servers(a: Sequence[str], b: Sequence[str]) -> list[str]:
    """The servers of `b` that `a` names too, however spelt (as `b` spells them)."""
    keys = {_server_key(url) for url in a}
    return [url for url in b if _server_key(url) in keys]


def _server_key(url: str) -> str:
    """Two spellings of one server (…:8000 and …:8000/v1/, any case of the host) give one key."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}{parts.path.rstrip('/').removesuffix('/v1')}"


def _clip(value: object, limit: int = 120) -> str:
    """repr(value), cut to `limit` characters with how many were cut (an error stays one short line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _describe(error: ValidationError) -> str:
    """One line per bad setting: name, what is expected, what was given."""
    lines = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        if not item["loc"]:  # a rule across settings names its settings itself
            lines.append(message)
            continue
        field = str(item["loc"][0])
        given = item.get("input")
        lines.append(f"{ENV_PREFIX}{field.upper()}: {message}, got {_clip(given)}")
    return "; ".join(lines)


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment; raise ConfigError with a readable line on bad values."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests call `get_settings.cache_clear()`)."""
    return load_settings()
