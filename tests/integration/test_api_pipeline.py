"""One pipeline behind /v1/jobs, /v1/infer and /v1/embeddings: the same metrics, admission,
idempotency and cancel-on-disconnect on all three (real API process, real Redis)."""

from __future__ import annotations

import httpx
import pytest

from inferq.shared import keys
from tests.integration.stack import Stack, metric, wait_for

ROUTES = {
    "/v1/jobs": lambda text: {"input": text},
    "/v1/infer": lambda text: {"input": text, "wait": 0},
    "/v1/embeddings": lambda text: {"input": text, "wait": 0},
}


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_every_route_counts_submissions_and_refusals_and_answers_429(
    stack: Stack, path: str
) -> None:
    base = stack.api(max_queue=1)  # no worker: the first job stays queued
    body = ROUTES[path]
    assert httpx.post(f"{base}{path}", json=body("first"), timeout=10).status_code == 202
    assert metric(base, "inferq_jobs_submitted_total", model="echo") == 1
    r = httpx.post(f"{base}{path}", json=body("second"), timeout=10)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
    assert "INFERQ_MAX_QUEUE=1" in r.text
    assert metric(base, "inferq_jobs_rejected_total", model="echo", reason="queue_full") == 1
    assert metric(base, "inferq_jobs_submitted_total", model="echo") == 1


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_every_route_honours_the_idempotency_key(stack: Stack, path: str) -> None:
    base = stack.api()
    headers = {"Idempotency-Key": f"same-{path}"}
    first = httpx.post(f"{base}{path}", json=ROUTES[path]("once"), headers=headers, timeout=10)
    again = httpx.post(f"{base}{path}", json=ROUTES[path]("once"), headers=headers, timeout=10)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert stack.r.xlen(keys.stream("echo")) == 1


@pytest.mark.parametrize("path", ["/v1/infer", "/v1/embeddings"])
def test_a_client_that_leaves_cancels_its_unstarted_job(stack: Stack, path: str) -> None:
    base = stack.api()  # no worker: nothing starts the job
    headers = {"Idempotency-Key": f"leaves-{path}"}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{base}{path}", json={"input": "nobody waits"}, headers=headers, timeout=0.5)
    # The same key on /v1/jobs hands back the job the first request created.
    same = httpx.post(f"{base}/v1/jobs", json={"input": "nobody waits"}, headers=headers, timeout=5)
    job_id = same.json()["id"]

    def cancelled() -> bool:
        return httpx.get(f"{base}/v1/jobs/{job_id}", timeout=5).json()["status"] == "cancelled"

    wait_for(cancelled, 10, "the job to be cancelled")
    assert metric(base, "inferq_jobs_submitted_total", model="echo") == 1


def test_retry_after_is_the_time_for_the_backlog_to_drain(stack: Stack) -> None:
    """With a measured rate, Retry-After = ceil(excess items / items per second)."""
    from inferq.shared.registry import WorkerBeat

    base = stack.api(max_queue=10)
    now = int(__import__("time").time() * 1000)
    beat = WorkerBeat(
        id="w", host="h", pid=1, model="echo", backend="echo", device="cpu", token_ceiling=1,
        items_per_s=2.0, last_batch_size=1, last_batch_tokens=1, last_batch_at_ms=now, batches=1,
        ooms=0, held_items=0, beat_ms=now, mem_allocated=0, mem_reserved=0, mem_total=0,
    )  # fmt: skip
    stack.r.hset(keys.worker("w"), mapping=beat.to_hash())
    stack.r.zadd(keys.workers("echo"), {"w": now + 60_000})
    for i in range(10):
        assert httpx.post(f"{base}/v1/jobs", json={"input": f"q {i}"}, timeout=5).status_code == 202
    r = httpx.post(f"{base}/v1/jobs", json={"inputs": ["a", "b", "c", "d", "e"]}, timeout=5)
    # 10 queued + 5 = 15 items; the cap is 10: 5 too many at 2 items/s → 3 s (not the floor 1).
    assert r.status_code == 429 and r.headers["retry-after"] == "3", (r.headers, r.text)


def _ttl(stack: Stack, record: str) -> int:
    return int(stack.r.ttl(record))


@pytest.mark.parametrize("path", ["/v1/infer", "/v1/embeddings"])
def test_a_job_answered_in_its_response_is_kept_briefly(stack: Stack, path: str) -> None:
    """Its answer was delivered: the record lives INFERQ_SYNC_RESULT_TTL_S, not the hour a
    polled job needs, unless the request asked for a TTL."""
    stack.worker()
    base = stack.api(sync_result_ttl_s=20)
    indexes = [keys.tenant_jobs("echo", 0, 1, "", brief) for brief in (False, True)]

    def answered(body: dict[str, object], headers: dict[str, str] | None = None) -> str:
        """The record of the job the request made; it is in the index its TTL says."""
        before = [stack.r.zcard(i) for i in indexes]
        r = httpx.post(f"{base}{path}", json=body, headers=headers, timeout=20)
        assert r.status_code != 202, r.text  # answered (echo is no embedder: maybe a 4xx)
        grew = [i for i, n in zip(indexes, before, strict=True) if stack.r.zcard(i) > n]
        assert len(grew) == 1, grew
        key = stack.r.zrange(grew[0], -1, -1)[0].decode()  # its record, the newest
        assert (grew[0] == indexes[1]) == (_ttl(stack, key) <= 20), (grew, _ttl(stack, key))
        return key

    brief = answered({"input": "answered"})
    assert 0 < _ttl(stack, brief) <= 20
    assert stack.r.exists(brief)  # GET /v1/jobs/{id} finds it meanwhile
    key = {"Idempotency-Key": f"k-{path}"}
    keyed = answered({"input": "keyed"}, key)
    assert 0 < _ttl(stack, keyed) <= 20  # brief too: a key's retry comes within that time
    again = httpx.post(f"{base}{path}", json={"input": "keyed"}, headers=key, timeout=20)
    assert again.status_code == 200 and stack.r.zcard(indexes[1]) == 2, again.text
    if path == "/v1/infer":  # OpenAI's body has no `result_ttl_s`
        asked = answered({"input": "asked", "result_ttl_s": 600})
        assert 20 < _ttl(stack, asked) <= 600
    polled = httpx.post(f"{base}/v1/jobs", json={"input": "polled"}, timeout=10).json()["id"]
    wait_for(lambda: _ttl(stack, keys.job(polled)) > 0, 20, "the polled job to finish")
    assert _ttl(stack, keys.job(polled)) > 3000
    assert stack.r.zscore(indexes[0], keys.job(polled)) is not None


@pytest.mark.parametrize("path", ["/v1/infer", "/v1/embeddings"])
def test_a_wait_that_ends_in_202_keeps_the_record_the_default_ttl(stack: Stack, path: str) -> None:
    base = stack.api(sync_result_ttl_s=20)  # no worker yet: the wait runs out
    r = httpx.post(f"{base}{path}", json={"input": "late", "wait": 0}, timeout=10)
    assert r.status_code == 202, r.text
    job_id = r.headers["location"].rsplit("/", 1)[1]
    stack.worker()
    done = httpx.get(f"{base}{r.headers['location']}", params={"wait": 20}, timeout=30).json()
    assert done["status"] in ("succeeded", "failed")  # final: FINISH has set the TTL
    assert _ttl(stack, keys.job(job_id)) > 3000  # the Location is good for the default hour
    # ... and it is indexed with the jobs kept that long, where its expiry is in order.
    default, brief = (keys.tenant_jobs("echo", 0, 1, "", b) for b in (False, True))
    assert stack.r.zscore(default, keys.job(job_id)) is not None
    assert stack.r.zscore(brief, keys.job(job_id)) is None
