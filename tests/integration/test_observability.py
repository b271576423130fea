"""Heartbeats, /v1/health, /v1/models and /metrics against real processes.

Request overhead of metrics is measured by `scripts/metrics_overhead.py`, not here:
a timing test on a shared CI machine would only measure the machine.
"""

from __future__ import annotations

import time

import httpx

from inferq.redis_server import free_port
from tests.integration.stack import Stack, wait_for
from tests.unit.shared.test_metrics import API_EXPOSED, WORKER_EXPOSED

HEARTBEAT_FIELDS = {
    "id", "host", "pid", "model", "device", "token_ceiling", "items_per_s",
    "last_batch_size", "last_batch_tokens", "last_batch_at_ms", "batches", "held_items",
    "beat_ms",
}  # fmt: skip


def _health(base: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{base}/v1/health", timeout=5).json()


def _families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_health_shows_queue_then_the_worker(stack: Stack) -> None:
    base = stack.api()
    body = _health(base)
    assert body["status"] == "degraded" and body["redis"]["up"] is True
    assert body["models"]["echo"]["status"] == "unserved"
    assert body["redis"]["rtt_ms"] >= 0

    # Nothing serves echo yet: jobs wait, and health shows depth and age.
    for _ in range(3):
        assert httpx.post(f"{base}/v1/jobs", json={"inputs": ["a b", "c"]}).status_code == 202
    echo = _health(base)["models"]["echo"]
    assert echo["queue_depth"] == 3 and echo["oldest_queued_age_ms"] >= 0
    assert echo["workers"] == []

    stack.worker(worker_id="obs-w1")

    def served() -> dict | None:  # type: ignore[type-arg]
        b = _health(base)
        m = b["models"]["echo"]
        done = b["status"] == "ok" and m["queue_depth"] == 0 and m["workers"]
        return b if done and m["workers"][0].get("batches", 0) >= 1 else None

    body = wait_for(served, 30, "health ok with a live worker and an empty queue", 0.1)
    echo = body["models"]["echo"]
    assert echo["oldest_queued_age_ms"] is None and body["problems"] == []
    (w,) = echo["workers"]
    assert set(w) >= HEARTBEAT_FIELDS, set(w)
    assert w["id"] == "obs-w1" and w["model"] == "echo" and w["device"] == "cpu"
    assert isinstance(w["pid"], int) and isinstance(w["token_ceiling"], int)
    assert isinstance(w["items_per_s"], float) and w["beat_age_ms"] < 5000


def test_health_down_when_redis_is_unreachable(stack: Stack) -> None:
    base = stack.api(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_timeout_s=0.5)
    started = time.monotonic()
    r = httpx.get(f"{base}/v1/health", timeout=10)
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "down" and body["redis"]["up"] is False
    assert time.monotonic() - started < 5


def test_models_lists_live_workers(stack: Stack) -> None:
    stack.worker(worker_id="obs-models")
    base = stack.api()
    body = httpx.get(f"{base}/v1/models", timeout=5).json()
    assert body["default"] == "echo"
    (m,) = body["models"]
    assert m["name"] == "echo"
    (w,) = m["workers"]
    assert w["id"] == "obs-models" and w["device"] == "cpu" and w["token_ceiling"] > 0
    assert {"backend", "calibration", "host"} <= set(w)


def test_api_metrics_names(stack: Stack) -> None:
    base = stack.api()
    r = httpx.get(f"{base}/metrics", timeout=5)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert set(API_EXPOSED) <= _families(r.text)
    assert 'inferq_queue_depth{model="echo"} 0.0' in r.text


def test_api_metrics_count_submissions_and_rejections(stack: Stack) -> None:
    base = stack.api(max_inputs_per_job=2)
    assert httpx.post(f"{base}/v1/jobs", json={"inputs": ["a"]}).status_code == 202
    assert httpx.post(f"{base}/v1/jobs", json={"inputs": ["a", "b", "c"]}).status_code == 413
    text = httpx.get(f"{base}/metrics", timeout=5).text
    assert 'inferq_jobs_submitted_total{model="echo"} 1.0' in text
    assert 'inferq_queue_depth{model="echo"} 1.0' in text
    rejected = [ln for ln in text.splitlines() if ln.startswith("inferq_jobs_rejected_total{")]
    assert rejected and 'model="echo"' in rejected[0], text


def test_worker_metrics_endpoint(stack: Stack) -> None:
    port = free_port()
    stack.worker(worker_metrics_port=port)
    base = stack.api()
    assert httpx.post(f"{base}/v1/infer", json={"inputs": ["a b c", "d"]}).status_code == 200

    def scraped() -> str | None:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return None
        return (
            text if 'inferq_jobs_finished_total{model="echo",status="succeeded"}' in text else None
        )

    text = wait_for(scraped, 15, "the worker's /metrics to count the job", 0.1)
    assert set(WORKER_EXPOSED) <= _families(text)
    assert 'inferq_batch_size_count{model="echo"}' in text
