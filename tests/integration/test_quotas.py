"""Redis that cannot only grow, and tenants that cannot starve each other: per-tenant queue
caps, inputs dropped from finished records, and the API's 503 before a small-maxmemory Redis
refuses writes — against a real redis-server, API and worker processes."""

from __future__ import annotations

import httpx
import redis

from inferq.shared import keys
from inferq.shared.schema import JobField
from tests.integration.stack import Stack, wait_for

A = {"Authorization": "Bearer key-a-0123456789"}
B = {"Authorization": "Bearer key-b-0123456789"}


def _post(
    base: str, body: dict[str, object], headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(f"{base}/v1/jobs", json=body, headers=headers, timeout=10)


def _final(base: str, job_id: str, headers: dict[str, str] | None = None) -> dict[str, object]:
    r = httpx.get(f"{base}/v1/jobs/{job_id}", params={"wait": 20}, headers=headers, timeout=30)
    body: dict[str, object] = r.json()
    assert body["status"] in ("succeeded", "failed", "expired", "cancelled"), body
    return body


def test_one_tenant_cannot_fill_the_queue_for_another(stack: Stack) -> None:
    base = stack.api(
        api_keys="a:key-a-0123456789,b:key-b-0123456789", max_queue=20, tenant_queue_share=0.5
    )
    accepted = [_post(base, {"input": f"a{i}"}, A) for i in range(10)]
    assert all(r.status_code == 202 for r in accepted)
    refused = _post(base, {"input": "a-more"}, A)
    assert refused.status_code == 429 and refused.headers["retry-after"]
    message = refused.json()["error"]["message"]
    assert "tenant 'a'" in message and "INFERQ_TENANT_QUEUE_SHARE=0.5" in message
    # The other tenant still gets its share, though a alone holds half the queue.
    assert all(_post(base, {"input": f"b{i}"}, B).status_code == 202 for i in range(10))
    assert httpx.get(f"{base}/metrics", headers=A, timeout=5).status_code == 403  # not a tenant's
    # Once its jobs finish, a's counters are freed (FINISH takes back what SUBMIT counted).
    stack.worker()
    for r in accepted:
        assert _final(base, r.json()["id"], A)["status"] == "succeeded"
    wait_for(
        lambda: int(stack.r.get(keys.tenant_items("echo", 0, 1, "a")) or 0) == 0,
        20,
        "tenant a's item counter to return to 0",
    )
    assert _post(base, {"input": "a-again"}, A).status_code == 202


def test_a_finished_job_keeps_its_outcome_not_its_inputs(stack: Stack) -> None:
    stack.worker()
    base = stack.api(models="echo,idle=echo")  # no worker serves "idle": its jobs wait
    done = httpx.post(f"{base}/v1/infer", json={"inputs": ["x" * 5000, "y"]}, timeout=30)
    assert done.status_code == 200 and len(done.json()["outputs"]) == 2
    record = keys.job(done.json()["id"])
    assert stack.r.hexists(record, JobField.OUTPUTS)
    assert not stack.r.hexists(record, JobField.INPUTS)  # INFERQ_KEEP_INPUTS is off
    # A cancelled job (written final by the API, not a worker) drops them too.
    queued = _post(base, {"input": "z", "model": "idle"}).json()
    assert stack.r.hexists(keys.job(queued["id"]), JobField.INPUTS)  # kept while it waits
    assert httpx.delete(f"{base}/v1/jobs/{queued['id']}", timeout=5).status_code == 200
    assert _final(base, queued["id"])["status"] == "cancelled"
    assert not stack.r.hexists(keys.job(queued["id"]), JobField.INPUTS)


def test_redis_near_its_maxmemory_answers_503_then_recovers_and_loses_nothing(
    stack: Stack,
) -> None:
    """A Redis with a small maxmemory (noeviction): the API refuses new work with 503 +
    Retry-After before Redis refuses a write (no OOM error in Redis's stats), every job it
    accepted succeeds once a worker drains them, and then it accepts again."""
    admin = redis.Redis.from_url(stack.redis_url)
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", str(used + 48 * 2**20))
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_resetstat()
    try:
        base = stack.api(redis_memory_high_water=0.5, max_queue_bytes=2**40, max_queue=10**6)
        accepted: list[str] = []
        body = {"inputs": ["w" * 20_000] * 10}  # ~200 KB of inputs a job
        with httpx.Client(timeout=10) as client:
            for _ in range(2_000):
                r = client.post(f"{base}/v1/jobs", json=body)
                if r.status_code == 503:
                    break
                assert r.status_code == 202, r.text
                accepted.append(r.json()["id"])
        assert r.status_code == 503 and r.headers["retry-after"]
        assert "INFERQ_REDIS_MEMORY_HIGH_WATER" in r.json()["error"]["message"]
        assert len(accepted) > 10
        errors = admin.info("errorstats")
        assert not any(k.startswith("errorstat_OOM") for k in errors), errors
        stack.worker()
        for job_id in accepted:
            assert _final(base, job_id)["status"] == "succeeded"
        # Finished records hold no inputs: memory came back, and so does admission.
        wait_for(
            lambda: _post(base, {"input": "after"}).status_code == 202,
            20,
            "the API to accept work again",
            interval_s=0.2,
        )
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()
