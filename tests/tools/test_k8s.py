"""deploy/k8s/ keeps to what inferq is: parsed here, never applied (no cluster on the
development machines).

Every INFERQ_* name is a setting; probes hit routes the API serves, on the port it listens
on; a worker's grace period outlasts its drain; the KEDA triggers watch the streams and
group shared/keys.py builds for the configured model; every reference (HPA, ScaledObject,
Service, envFrom, TriggerAuthentication, ServiceMonitor) names an object that exists; every
variant's Redis runs with a ceiling and noeviction; the API requires keys, and Prometheus
scrapes its /metrics with one of the admin keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from inferq.api.core.auth import load_admin_keys, load_api_keys
from inferq.api.routes import health, observability
from inferq.shared import keys
from inferq.shared.settings import Settings
from tests.tools.test_compose import check_redis_ceiling

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
FILES = sorted(K8S.rglob("*.yaml"))
BASE = sorted(K8S.glob("*.yaml"))
# Each variant's folder is applied after the base (later objects replace earlier ones).
VARIANTS = {
    "single": BASE,
    "sentinel": BASE + sorted((K8S / "sentinel").glob("*.yaml")),
    "cluster": BASE + sorted((K8S / "cluster").glob("*.yaml")),
}
SCALERS = {
    "single": "redis-streams",
    "sentinel": "redis-sentinel-streams",
    "cluster": "redis-cluster-streams",
}
KINDS = {
    "ConfigMap", "Secret", "Deployment", "Service", "HorizontalPodAutoscaler",
    "ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PodMonitor",
}  # fmt: skip
API_GRACEFUL_S = 10  # uvicorn's timeout_graceful_shutdown in api/main.py


def _docs(paths: list[Path]) -> list[dict[str, Any]]:
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


def _applied(variant: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) → object, as `kubectl apply` in that order leaves them (later wins)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in _docs(VARIANTS[variant])}


def _of(objs: dict[tuple[str, str], dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for (k, _), o in sorted(objs.items()) if k == kind]


# The Secrets ship without working values (empty keys, a placeholder Redis password): what an
# operator fills in before applying, as the recipes in auth.yaml and redis.yaml say.
_PROMETHEUS = "5c1a9e" * 4
OPERATOR = {
    "INFERQ_API_KEYS": "alpha:" + "a1b2c3" * 4,
    "INFERQ_ADMIN_KEYS": f"prometheus:{_PROMETHEUS},ops:" + "d4e5f6" * 4,
    "prometheus-token": _PROMETHEUS,
    "redis-password": "r3al-redis-pa55",
}


def _filled(objs: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """`objs` with every Secret filled in as the operator would."""
    out = dict(objs)
    for (kind, name), o in objs.items():
        if kind != "Secret":
            continue
        data = {k: OPERATOR.get(k, v) for k, v in (o.get("stringData") or {}).items()}
        if "INFERQ_REDIS_URL" in data:
            data["INFERQ_REDIS_URL"] = data["INFERQ_REDIS_URL"].replace(
                ":change-me@", f":{OPERATOR['redis-password']}@"
            )
        out[(kind, name)] = {**o, "stringData": data}
    return out


def _containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return list(deployment["spec"]["template"]["spec"]["containers"])


def _env(objs: dict[tuple[str, str], dict[str, Any]], container: dict[str, Any]) -> dict[str, Any]:
    """The container's environment: its envFrom ConfigMaps and Secrets, then its env."""
    out: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        name = (source.get("configMapRef") or source["secretRef"])["name"]
        obj = objs.get((kind, name))
        assert obj is not None, f"envFrom names a missing {kind} {name}"
        out |= obj.get("data") or obj.get("stringData") or {}
    for var in container.get("env", []):
        out[var["name"]] = var.get("value", var.get("valueFrom"))
    return out


def _inferq_names(objs: dict[tuple[str, str], dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for o in [*_of(objs, "ConfigMap"), *_of(objs, "Secret")]:
        for name in o.get("data") or o.get("stringData") or {}:
            yield o["metadata"]["name"], name
    for d in _of(objs, "Deployment"):
        for c in _containers(d):
            for var in c.get("env", []):
                yield d["metadata"]["name"], var["name"]


def test_every_file_parses_into_known_kinds() -> None:
    assert FILES, "no manifests in deploy/k8s/"
    for doc in _docs(FILES):
        assert doc["kind"] in KINDS, doc["kind"]
        assert doc["metadata"]["name"].startswith("inferq"), doc["metadata"]["name"]
    kinds = {d["kind"] for d in _docs(VARIANTS["single"])}
    assert kinds == KINDS


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_inferq_name_is_a_setting(variant: str) -> None:
    settings = {f"INFERQ_{n.upper()}" for n in Settings.model_fields}
    names = list(_inferq_names(_applied(variant)))
    unknown = [(where, n) for where, n in names if n.startswith("INFERQ_") and n not in settings]
    assert not unknown
    # And their values validate: the ConfigMap and Secret as Settings would read them, once
    # the operator has filled the Secrets in.
    objs = _filled(_applied(variant))
    for c in _containers(objs[("Deployment", "inferq-api")]):
        env = {k: v for k, v in _env(objs, c).items() if k.startswith("INFERQ_")}
        Settings(**{k.removeprefix("INFERQ_").lower(): v for k, v in env.items()})


def test_the_sentinel_variant_sets_sentinels() -> None:
    secret = _applied("sentinel")[("Secret", "inferq-redis")]["stringData"]
    assert secret["INFERQ_REDIS_SENTINELS"] and int(secret["INFERQ_REDIS_WAIT_REPLICAS"]) >= 1
    assert (
        "INFERQ_REDIS_SENTINELS" not in _applied("single")[("Secret", "inferq-redis")]["stringData"]
    )


def test_the_cluster_variant_shards_the_queue_and_waits_for_a_replica() -> None:
    secret = _filled(_applied("cluster"))[("Secret", "inferq-redis")]["stringData"]
    settings = Settings(**{k.removeprefix("INFERQ_").lower(): v for k, v in secret.items()
                           if k.startswith("INFERQ_")})  # fmt: skip
    assert settings.redis_cluster and settings.stream_shards > 1
    assert settings.redis_wait_replicas >= 1 and not settings.redis_sentinels


def test_api_probes_hit_real_routes_on_the_served_port() -> None:
    routes = {r.path for r in health.router.routes}  # type: ignore[attr-defined]
    api = _applied("single")[("Deployment", "inferq-api")]
    (container,) = _containers(api)
    words = container["command"]
    port = int(words[words.index("--port") + 1])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named["http"] == port
    probes = {k: container[k]["httpGet"] for k in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" in routes
    assert probes["livenessProbe"]["path"] == "/healthz" in routes  # no Redis call
    assert all(named.get(p["port"], p["port"]) == port for p in probes.values())
    assert api["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > API_GRACEFUL_S


def test_workers_get_a_gpu_a_device_an_id_and_time_to_drain() -> None:
    objs = _applied("single")
    workers = [d for d in _of(objs, "Deployment") if d["metadata"]["name"] != "inferq-api"]
    assert len(workers) >= 2  # one Deployment per GPU type
    for d in workers:
        spec = d["spec"]["template"]["spec"]
        (c,) = _containers(d)
        env = _env(objs, c)
        assert c["command"][:2] == ["inferq", "worker"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert env["INFERQ_DEVICE"] == "cuda:0"
        assert env["INFERQ_WORKER_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        drain_s = float(env.get("INFERQ_DRAIN_S", Settings.model_fields["drain_s"].default))
        assert spec["terminationGracePeriodSeconds"] > drain_s, d["metadata"]["name"]
        port = int(env["INFERQ_WORKER_METRICS_PORT"])
        assert {p["containerPort"] for p in c["ports"]} == {port}


@pytest.mark.parametrize("variant", VARIANTS)
def test_keda_watches_the_model_streams_and_group_keys_builds(variant: str) -> None:
    objs = _applied(variant)
    model = objs[("ConfigMap", "inferq-config")]["data"]["INFERQ_MODEL"]
    secret = objs[("Secret", "inferq-redis")]["stringData"]
    shards = int(secret.get("INFERQ_STREAM_SHARDS", 1))
    lanes = {s for shard in range(shards) for s in keys.streams(model, shard, shards)}
    workers = {d["metadata"]["name"] for d in _of(objs, "Deployment")} - {"inferq-api"}
    scaled = _of(objs, "ScaledObject")
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled} == workers
    for s in scaled:
        # /readyz needs a live worker: never scale the last one away.
        assert s["spec"]["minReplicaCount"] >= 1
        triggers = s["spec"]["triggers"]
        assert {t["metadata"]["stream"] for t in triggers} == lanes
        for t in triggers:
            assert t["type"] == SCALERS[variant]
            assert t["metadata"]["consumerGroup"] == keys.GROUP
            assert "lagCount" in t["metadata"]  # not pendingEntriesCount: see scaling.yaml
            auth = objs[("TriggerAuthentication", t["authenticationRef"]["name"])]
            for ref in auth["spec"]["secretTargetRef"]:
                secret = objs[("Secret", ref["name"])]["stringData"]
                assert ref["key"] in secret


def test_references_resolve() -> None:
    objs = _applied("single")
    hpa = objs[("HorizontalPodAutoscaler", "inferq-api")]["spec"]["scaleTargetRef"]
    assert ("Deployment", hpa["name"]) in objs
    service = objs[("Service", "inferq-api")]["spec"]
    labels = objs[("Deployment", "inferq-api")]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    for d in _of(objs, "Deployment"):
        selector = d["spec"]["selector"]["matchLabels"]
        assert selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()


# --- Redis's ceiling: "Redis full → 503" needs a maxmemory, and noeviction ---


def _redis_conf(config_map: dict[str, Any]) -> dict[str, str]:
    lines = config_map["data"]["redis.conf"].splitlines()
    pairs = [line.split(None, 1) for line in lines if line.strip() and not line.startswith("#")]
    return {k: v.strip() for k, v in pairs}


@pytest.mark.parametrize(
    "path", sorted(K8S.rglob("redis.yaml")), ids=lambda p: str(p.relative_to(K8S))
)
def test_every_redis_manifest_sets_a_ceiling_and_noeviction(path: Path) -> None:
    """Each variant's Redis file (single, sentinel, cluster) says what its servers run with."""
    (config_map,) = [
        d
        for d in _docs([path])
        if (d["kind"], d["metadata"]["name"]) == ("ConfigMap", "inferq-redis-server")
    ]
    conf = _redis_conf(config_map)
    check_redis_ceiling(conf.get("maxmemory", "0"), conf.get("maxmemory-policy"), str(path))
    assert conf.get("appendonly") == "yes", path


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_applies_its_own_redis_config(variant: str) -> None:
    applied = _applied(variant)[("ConfigMap", "inferq-redis-server")]
    folder = K8S if variant == "single" else K8S / variant
    (own,) = [d for d in _docs([folder / "redis.yaml"]) if d["kind"] == "ConfigMap"]
    assert applied == own


# --- keys: tenants apart, and the operator's /metrics scraped with an admin key ---


def _api_settings(objs: dict[tuple[str, str], dict[str, Any]]) -> Settings:
    (container,) = _containers(objs[("Deployment", "inferq-api")])
    env = {k: v for k, v in _env(objs, container).items() if k.startswith("INFERQ_")}
    return Settings(**{k.removeprefix("INFERQ_").lower(): v for k, v in env.items()})


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_shipped_secrets_hold_no_working_values(variant: str) -> None:
    """Applied as shipped, the API refuses to start, naming each setting to fill in."""
    with pytest.raises(ValidationError) as e:
        _api_settings(_applied(variant))
    message = str(e.value)
    for setting in ("INFERQ_API_KEYS", "INFERQ_ADMIN_KEYS", "INFERQ_REDIS_URL"):
        assert setting in message, (setting, message)
    assert "placeholder password" in message


@pytest.mark.parametrize("variant", VARIANTS)
def test_api_requires_tenant_and_admin_keys(variant: str) -> None:
    settings = _api_settings(_filled(_applied(variant)))
    assert load_api_keys(settings), "no INFERQ_API_KEYS: every caller is one anonymous tenant"
    assert load_admin_keys(settings), "no INFERQ_ADMIN_KEYS: /metrics and /v1/health closed"


def test_prometheus_scrapes_api_metrics_with_an_admin_key() -> None:
    objs = _filled(_applied("single"))
    assert "/metrics" in {r.path for r in observability.admin.routes}  # type: ignore[attr-defined]
    (monitor,) = _of(objs, "ServiceMonitor")
    service = next(
        s
        for s in _of(objs, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    auth = endpoint["authorization"]
    assert auth.get("type", "Bearer") == "Bearer"
    secret = objs[("Secret", auth["credentials"]["name"])]["stringData"]
    token = secret[auth["credentials"]["key"]].encode()
    admins = load_admin_keys(_api_settings(objs))
    assert token in admins, "the token Prometheus sends is not an admin key"
    assert token not in load_api_keys(_api_settings(objs)), "a tenant's key gets 403"


def test_worker_metrics_are_scraped_on_their_named_port() -> None:
    objs = _applied("single")
    (monitor,) = _of(objs, "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    workers = [d for d in _of(objs, "Deployment") if d["metadata"]["name"] != "inferq-api"]
    for d in workers:
        assert selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        (c,) = _containers(d)
        port = int(_env(objs, c)["INFERQ_WORKER_METRICS_PORT"])
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert named[endpoint["port"]] == port, d["metadata"]["name"]
    api = objs[("Deployment", "inferq-api")]["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= api.items(), "the PodMonitor would scrape the API without a key"
