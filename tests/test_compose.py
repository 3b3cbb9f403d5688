"""compose.yaml: every service is healthy-checked, every Crucible command it runs exists in the CLI, and Debian's
docker-compose reads it (the short case of tests/compose, which brings it up: `make test-compose`)."""

from __future__ import annotations

import re
import secrets
import shutil
from pathlib import Path

import pytest
import typer.main
import yaml

from cli.main import app
from tests.compose.project import Project


def _interpolate(word: str) -> str:
    """Compose's `${VAR:-default}` (or `${VAR-default}`) with nothing set: the default."""
    return re.sub(r"\$\{[A-Z_]+:?-([^}]*)\}", r"\1", word)


COMPOSE = yaml.safe_load((Path(__file__).parents[1] / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
OURS = sorted(name for name, service in SERVICES.items() if _interpolate(service.get("image", "")) == "crucible:latest")


def test_the_production_services_are_all_there() -> None:
    assert {"postgres", "redis", "api", "controller", "worker", "trainer", "vllm"} <= set(SERVICES)
    assert {"api", "controller", "worker", "trainer", "vllm", "vllm-2", "migrate"} == set(OURS)
    assert all(SERVICES[name]["build"]["context"] == "." for name in OURS)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_long_running_service_has_a_healthcheck(name: str) -> None:
    healthcheck = SERVICES[name].get("healthcheck", {})
    if name == "migrate":
        assert healthcheck.get("disable") is True  # a one-shot job
    else:
        assert healthcheck.get("test"), f"{name} has no healthcheck"


@pytest.mark.parametrize("name", OURS)
def test_service_command_exists_in_the_cli(name: str) -> None:
    """Walk the real Typer app down the command's words, then parse the rest as its options."""
    words = [_interpolate(word) for word in SERVICES[name]["command"]]
    command = typer.main.get_command(app)
    path = "crucible"
    while hasattr(command, "list_commands"):  # a group: the next word names a subcommand
        assert words, f"{name}: `{path}` needs a subcommand"
        word, words = words[0], words[1:]
        group_ctx = command.make_context(path, [], resilient_parsing=True)
        sub = command.get_command(group_ctx, word)
        assert sub is not None, f"{name}: `{path} {word}` is no command"
        command, path = sub, f"{path} {word}"
    command.make_context(path, words)  # raises a usage error on unknown options or bad values
    assert command.callback is not None


def test_only_the_worker_sees_the_docker_socket() -> None:
    for name, service in SERVICES.items():
        mounts = [str(volume) for volume in service.get("volumes", [])]
        has_socket = any("docker.sock" in mount for mount in mounts)
        assert has_socket == (name == "worker"), name


def test_workers_consume_every_kind_and_the_pool_setting_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind no worker queue names would leave its episodes pending forever (chat was missing once)."""
    from core.settings import load_settings
    from environments.registry import kind_names

    command = SERVICES["worker"]["command"]
    queues = set(command[command.index("--queues") + 1].split(","))
    assert queues == set(kind_names()) - {"read_number"} | {"celery"}  # read_number is the local demo's
    environment = COMPOSE["x-crucible"]["environment"]
    monkeypatch.setenv("CRUCIBLE_POLICY_URLS", _interpolate(environment["CRUCIBLE_POLICY_URLS"]))
    settings = load_settings()
    assert settings.policy_urls == ["http://vllm:8000/v1"] and settings.policy_url == "http://vllm:8000/v1"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="needs Debian's docker-compose (scripts/setup.sh)")
def test_debians_docker_compose_reads_the_file_its_images_variables_with_the_public_defaults() -> None:
    """The short case: docker-compose 1.29 parses compose.yaml (its anchors, conditions, profiles), each image
    is a variable whose default is the public image, and a missing password is refused by name."""
    plain = Project(name=f"crucible-config-{secrets.token_hex(3)}", variables={"POSTGRES_PASSWORD": "x"}).config()
    services = plain["services"]
    assert (services["postgres"]["image"], services["redis"]["image"]) == ("postgres:16-bookworm", "redis:7-bookworm")
    crucible = [name for name, service in services.items() if "build" in service]
    assert set(crucible) >= {"migrate", "api", "controller", "worker", "trainer", "vllm"}
    for name in crucible:
        assert services[name]["image"] == "crucible:latest"
        assert services[name]["build"]["args"] == {"PYTHON_IMAGE": "python:3.11-slim-bookworm", "CRUCIBLE_EXTRAS": "gpu"}
    standins = {"CRUCIBLE_POSTGRES_IMAGE": "standin/pg:1", "CRUCIBLE_REDIS_IMAGE": "standin/redis:1",
                "CRUCIBLE_PYTHON_IMAGE": "standin/python:1", "CRUCIBLE_EXTRAS": "", "CRUCIBLE_IMAGE": "crucible:t"}
    named = Project(name=f"crucible-config-{secrets.token_hex(3)}",
                    variables={"POSTGRES_PASSWORD": "x", **standins}).config()["services"]
    assert (named["postgres"]["image"], named["redis"]["image"], named["worker"]["image"]) == (
        "standin/pg:1", "standin/redis:1", "crucible:t")
    assert named["api"]["build"]["args"] == {"PYTHON_IMAGE": "standin/python:1", "CRUCIBLE_EXTRAS": ""}
    refused = Project(name="crucible-config-refused", variables={}).command("config", check=False)
    assert refused.returncode != 0 and "set POSTGRES_PASSWORD" in refused.stderr
