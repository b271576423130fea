"""The result cache against the real stack: hits never reach a worker, misses fill it, tenants
and model versions never share entries they should not, and the cache stays in its bound."""

from __future__ import annotations

from typing import Any

import httpx
import msgpack

from inferq.shared import keys
from tests.integration.stack import Proc, Stack, wait_for


def _beat(stack: Stack, proc: Proc) -> dict[str, str]:
    for member in stack.r.zrange(keys.workers("echo"), 0, -1):
        raw = stack.r.hgetall(keys.worker(member.decode()))
        if raw.get(b"pid") == str(proc.pid).encode():
            return {k.decode(): v.decode() for k, v in raw.items()}
    raise AssertionError("no heartbeat record for the worker")


def _settled_batches(stack: Stack, proc: Proc) -> int:
    """The worker's batch count, read after two fresh heartbeats (so nothing is in flight)."""
    first = int(_beat(stack, proc)["beat_ms"])
    wait_for(lambda: int(_beat(stack, proc)["beat_ms"]) > first, 5, "a heartbeat")
    second = int(_beat(stack, proc)["beat_ms"])
    wait_for(lambda: int(_beat(stack, proc)["beat_ms"]) > second, 5, "another heartbeat")
    return int(_beat(stack, proc)["batches"])


def _infer(base: str, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(f"{base}/v1/infer", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _lookups(base: str, result: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inferq_cache_lookups_total{") and f'result="{result}"' in line
    )


def test_a_repeat_is_answered_from_the_cache_without_a_worker(stack: Stack) -> None:
    worker = stack.worker()
    base = stack.api(cache_ttl_s=60)
    body = {"inputs": ["the cat sat", "on the mat"]}
    first = _infer(base, body)
    assert first["timings"]["cached"] is False and first["worker"]
    # The fill happens in the same step that makes the job final: no wait needed.
    batches = _settled_batches(stack, worker)
    second = _infer(base, body)
    assert second["timings"]["cached"] is True and "worker" not in second
    assert second["outputs"] == first["outputs"] and second["id"] != first["id"]
    assert _settled_batches(stack, worker) == batches  # no worker ran it
    # The cached job is a job like any other: readable, final, flagged.
    got = httpx.get(f"{base}/v1/jobs/{second['id']}", timeout=5).json()
    assert got["status"] == "succeeded" and got["timings"]["cached"] is True
    assert got["outputs"] == first["outputs"]
    # The async route answers a hit as already succeeded.
    r = httpx.post(f"{base}/v1/jobs", json=body, timeout=5)
    assert r.status_code == 202 and r.json()["status"] == "succeeded"
    # Anything that changes the outputs misses: another input, another order.
    third = _infer(base, {"inputs": ["on the mat", "the cat sat"]})
    assert third["timings"]["cached"] is False
    assert _lookups(base, "hit") == 2 and _lookups(base, "miss") == 2


def test_an_idempotency_key_repeat_returns_the_first_cached_job(stack: Stack) -> None:
    stack.worker()
    base = stack.api(cache_ttl_s=60)
    _infer(base, {"input": "warm the cache"})
    headers = {"Idempotency-Key": "k-1"}
    a = httpx.post(f"{base}/v1/jobs", json={"input": "warm the cache"}, headers=headers)
    b = httpx.post(f"{base}/v1/jobs", json={"input": "warm the cache"}, headers=headers)
    assert a.status_code == b.status_code == 202
    assert a.json()["id"] == b.json()["id"] and a.json()["status"] == "succeeded"


def test_tenants_do_not_share_entries_unless_told_to(stack: Stack) -> None:
    stack.worker()
    tenants = "alpha:key-a-0123456789,beta:key-b-0123456789"
    private = stack.api(cache_ttl_s=60, api_keys=tenants)
    body = {"input": "a private sentence"}
    assert _infer(private, body, "key-a-0123456789")["timings"]["cached"] is False
    assert _infer(private, body, "key-a-0123456789")["timings"]["cached"] is True
    assert (
        _infer(private, body, "key-b-0123456789")["timings"]["cached"] is False
    )  # beta's own miss
    shared = stack.api(cache_ttl_s=60, api_keys=tenants, cache_shared="true")
    body = {"input": "a shared sentence"}
    assert _infer(shared, body, "key-a-0123456789")["timings"]["cached"] is False
    assert _infer(shared, body, "key-b-0123456789")["timings"]["cached"] is True


def test_new_weights_make_new_keys(stack: Stack, tmp_path: Any) -> None:
    old = stack.worker()
    base = stack.api(cache_ttl_s=60)
    body = {"input": "versioned"}
    _infer(base, body)
    assert _infer(base, body)["timings"]["cached"] is True
    # Same model name, other weights (the version covers INFERQ_MODEL_PATH and its files).
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "w.bin").write_bytes(b"new")
    stack.worker(model_path=str(weights))
    old.stop()
    fresh = stack.api(cache_ttl_s=60)  # reads the new declaration at once
    assert _infer(fresh, body)["timings"]["cached"] is False


def test_the_cache_stays_within_its_byte_bound_and_never_evicts_jobs(stack: Stack) -> None:
    stack.worker()
    cap = 160  # three or four small echo outputs (~40 bytes each)
    base = stack.api(cache_ttl_s=60, cache_max_bytes=cap)
    ids = [_infer(base, {"input": f"sentence number {i}"})["id"] for i in range(12)]
    held = int(stack.r.get(keys.cache_bytes("echo")) or 0)
    entries = stack.r.zrange(keys.cache_index("echo"), 0, -1)
    assert 0 < held <= cap
    assert 1 <= len(entries) < 12  # older entries went to make room
    sizes = {k: int(v) for k, v in stack.r.hgetall(keys.cache_sizes("echo")).items()}
    assert set(sizes) == set(entries) and sum(sizes.values()) == held
    for key in entries:
        assert msgpack.unpackb(stack.r.get(key))  # every indexed entry is really there
    # The newest result is the one kept; the job records all survive.
    assert _infer(base, {"input": "sentence number 11"})["timings"]["cached"] is True
    assert all(stack.r.exists(keys.job(i)) for i in ids)
