"""Metric names, types and label sets are an interface (dashboards, alerts): pinned here."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from inferq.shared.metrics import (
    BATCH_SIZE_BUCKETS,
    BATCH_TOKENS_BUCKETS,
    SECONDS_BUCKETS,
    api_metrics,
    render,
    worker_metrics,
)

# family name → (type, label names of its samples, excluding `le`)
API = {
    "inferq_jobs_submitted": ("counter", {"model"}),
    "inferq_jobs_rejected": ("counter", {"model", "reason"}),
    "inferq_queue_depth": ("gauge", {"model"}),
    "inferq_requests_waiting": ("gauge", set()),
    "inferq_cache_lookups": ("counter", {"model", "result"}),
    "inferq_webhook_deliveries": ("counter", {"outcome"}),
    "inferq_webhook_attempt_seconds": ("histogram", set()),
    "inferq_batches_finished": ("counter", {"status"}),
    "inferq_batch_lines": ("counter", {"result"}),
    "inferq_redis_memory_ratio": ("gauge", set()),
    "inferq_background_errors": ("counter", {"loop"}),
    "inferq_webhook_deferrals": ("counter", {"why"}),
}
WORKER = {
    "inferq_jobs_finished": ("counter", {"model", "status"}),
    "inferq_job_queue_seconds": ("histogram", {"model"}),
    "inferq_job_latency_seconds": ("histogram", {"model"}),
    "inferq_batch_size": ("histogram", {"model"}),
    "inferq_batch_tokens": ("histogram", {"model"}),
    "inferq_batch_seconds": ("histogram", set()),
    "inferq_oom": ("counter", set()),
    "inferq_batch_splits": ("counter", set()),
    "inferq_token_ceiling": ("gauge", set()),
    "inferq_device_memory_bytes": ("gauge", {"kind"}),
    "inferq_background_errors": ("counter", {"loop"}),
}
# What a scrape shows: counters gain `_total`. The integration tests pin the same names.
API_EXPOSED = frozenset(
    {
        "inferq_jobs_submitted_total",
        "inferq_jobs_rejected_total",
        "inferq_queue_depth",
        "inferq_requests_waiting",
        "inferq_cache_lookups_total",
        "inferq_webhook_deliveries_total",
        "inferq_webhook_attempt_seconds",
        "inferq_batches_finished_total",
        "inferq_batch_lines_total",
        "inferq_redis_memory_ratio",
        "inferq_background_errors_total",
        "inferq_webhook_deferrals_total",
    }
)
WORKER_EXPOSED = frozenset({
    "inferq_jobs_finished_total",
    "inferq_job_queue_seconds",
    "inferq_job_latency_seconds",
    "inferq_batch_size",
    "inferq_batch_tokens",
    "inferq_batch_seconds",
    "inferq_oom_total",
    "inferq_batch_splits_total",
    "inferq_token_ceiling",
    "inferq_device_memory_bytes",
    "inferq_background_errors_total",
})  # fmt: skip
EXPOSED = API_EXPOSED | WORKER_EXPOSED


def _observe_everything() -> tuple[CollectorRegistry, CollectorRegistry]:
    a, w = api_metrics(), worker_metrics()
    a.jobs_submitted.labels(model="echo").inc()
    a.jobs_rejected.labels(model="echo", reason="queue_full").inc()
    a.queue_depth.labels(model="echo").set(3)
    a.cache_lookups.labels(model="echo", result="hit").inc()
    a.webhook_deliveries.labels(outcome="delivered").inc()
    a.webhook_attempt_seconds.observe(0.03)
    a.batches_finished.labels(status="completed").inc()
    a.batch_lines.labels(result="succeeded").inc(3)
    a.redis_memory_ratio.set(0.5)
    a.background_errors.labels(loop="batch_leases").inc()
    a.webhook_deferrals.labels(why="open").inc()
    w.jobs_finished.labels(model="echo", status="succeeded").inc()
    w.job_queue_seconds.labels(model="echo").observe(0.01)
    w.job_latency_seconds.labels(model="echo").observe(0.02)
    w.batch_size.labels(model="echo").observe(8)
    w.batch_tokens.labels(model="echo").observe(512)
    w.batch_seconds.observe(0.005)
    w.oom.inc()
    w.batch_splits.inc()
    w.token_ceiling.set(8192)
    w.set_device_memory(allocated=1, reserved=2, total=3, footprint=4, budget=5)
    w.background_errors.labels(loop="heartbeat").inc()
    return a.registry, w.registry


def _families(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    out = {}
    for fam in registry.collect():
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        out[fam.name] = (fam.type, labels)
    return out


def test_names_types_and_labels_are_pinned() -> None:
    api, worker = _observe_everything()
    assert _families(api) == API
    assert _families(worker) == WORKER


def test_exposition_names_and_no_created_series() -> None:
    api, worker = _observe_everything()
    text = (render(api) + render(worker)).decode()
    types = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert types == EXPOSED
    assert "_created" not in text
    for kind in ("allocated", "reserved", "total"):
        assert f'inferq_device_memory_bytes{{kind="{kind}"}}' in text


def test_fresh_registries_do_not_collide() -> None:
    a1, a2 = api_metrics(), api_metrics()
    a1.jobs_submitted.labels(model="m").inc()
    assert a2.registry.get_sample_value("inferq_jobs_submitted_total", {"model": "m"}) is None
    worker_metrics(), worker_metrics()  # a second set on a new registry is fine


def test_buckets() -> None:
    assert BATCH_SIZE_BUCKETS[0] == 1 and BATCH_SIZE_BUCKETS[-1] == 512
    assert BATCH_TOKENS_BUCKETS[-1] == 65536
    assert SECONDS_BUCKETS[0] == 0.001 and SECONDS_BUCKETS[-1] == 60
    w = worker_metrics()
    w.batch_size.labels(model="m").observe(3)
    le = {
        s.labels["le"]
        for fam in w.registry.collect()
        if fam.name == "inferq_batch_size"
        for s in fam.samples
        if s.name.endswith("_bucket")
    }
    assert {"1.0", "2.0", "4.0", "512.0", "+Inf"} <= le


@pytest.mark.parametrize("factory", [api_metrics, worker_metrics])
def test_explicit_registry_is_used(factory) -> None:  # type: ignore[no-untyped-def]
    reg = CollectorRegistry()
    m = factory(reg)
    assert m.registry is reg
    assert any(f.name.startswith("inferq_") for f in reg.collect())
