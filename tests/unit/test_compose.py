"""docker-compose.yml keeps the properties the README promises (no Docker needed to check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

yaml = pytest.importorskip("yaml")

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict), "docker-compose.yml must be a mapping"
    assert isinstance(doc.get("services"), dict), "docker-compose.yml has no services"
    return doc["services"]


def _words(command: str | list[str]) -> list[str]:
    return command.split() if isinstance(command, str) else [str(w) for w in command]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the `- KEY=value` form
        return dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _flag(words: list[str], flag: str) -> str | None:
    """Value of `--flag value` in a redis-server command line."""
    if flag in words:
        i = words.index(flag)
        return words[i + 1] if i + 1 < len(words) else None
    return None


def test_services_exist(services: dict[str, Any]) -> None:
    assert {"redis", "api", "worker"} <= set(services)


def test_redis_is_durable_and_never_evicts(services: dict[str, Any]) -> None:
    words = _words(services["redis"]["command"])
    assert _flag(words, "--appendonly") == "yes"
    assert _flag(words, "--maxmemory-policy") == "noeviction"


@pytest.mark.parametrize("name", ["redis", "api"])
def test_healthchecks(services: dict[str, Any], name: str) -> None:
    check = services[name].get("healthcheck")
    assert check, f"{name} has no healthcheck"
    assert check.get("test"), f"{name} healthcheck has no test"
    assert not check.get("disable", False)


def test_redis_healthcheck_pings(services: dict[str, Any]) -> None:
    assert "ping" in _words(services["redis"]["healthcheck"]["test"])


def test_api_healthcheck_probes_healthz(services: dict[str, Any]) -> None:
    assert any("/healthz" in w for w in _words(services["api"]["healthcheck"]["test"]))


@pytest.mark.parametrize("name", ["api", "worker"])
def test_waits_for_healthy_redis(services: dict[str, Any], name: str) -> None:
    depends = services[name].get("depends_on")
    assert isinstance(depends, dict), f"{name}: depends_on must use the long form with a condition"
    assert depends.get("redis", {}).get("condition") == "service_healthy"


@pytest.mark.parametrize("name", ["api", "worker"])
def test_redis_url_points_at_the_redis_service(services: dict[str, Any], name: str) -> None:
    url = _environment(services[name]).get("INFERQ_REDIS_URL")
    assert url, f"{name} has no INFERQ_REDIS_URL"
    parts = urlsplit(url)
    assert parts.scheme in ("redis", "rediss")
    assert parts.hostname == "redis"


@pytest.mark.parametrize(("name", "subcommand"), [("api", "api"), ("worker", "worker")])
def test_commands(services: dict[str, Any], name: str, subcommand: str) -> None:
    words = _words(services[name]["command"])
    assert words[:2] == ["inferq", subcommand]
