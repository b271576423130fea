"""Nothing accepted is lost, nothing bad gets in: real Redis, real workers, real API."""

from __future__ import annotations

import asyncio
import time

import httpx

from inferq.shared import keys
from inferq.shared.jobs import decode_job
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import Stack, wait_for


def _post(base: str, body: dict, path: str = "/v1/jobs", **kw: object) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=kw.pop("timeout", 10), **kw)  # type: ignore[arg-type]


def _job(base: str, job_id: str, wait: float = 0, **kw: object) -> dict:
    r = httpx.get(f"{base}/v1/jobs/{job_id}", params={"wait": wait}, timeout=wait + 10, **kw)  # type: ignore[arg-type]
    assert r.status_code == 200, r.text
    return r.json()


def test_live_worker_takes_over_a_killed_workers_jobs(stack: Stack) -> None:
    """B finishes what A held: the job A had on the device (one start counted on A) and the
    one waiting in A's hands (never started there, so A's death costs it no attempt)."""
    fast = {"heartbeat_ttl_s": 2, "visibility_timeout_s": 60}
    a = stack.worker(worker_id="A", echo_batch_delay_ms=3000, max_batch_size=1, **fast)
    base = stack.api()
    on_device = _post(base, {"input": "on A's device"}).json()
    waiting = _post(base, {"input": "in A's hands"}).json()
    wait_for(lambda: _job(base, on_device["id"])["status"] == "running", 10, "A to start a job")
    wait_for(lambda: _job(base, waiting["id"])["status"] == "running", 10, "A to hold the other")
    stack.worker(worker_id="B", **fast)
    a.popen.kill()
    killed = time.monotonic()
    bodies = {k: _job(base, j["id"], wait=20) for k, j in (("dev", on_device), ("held", waiting))}
    took = time.monotonic() - killed
    assert bodies["dev"]["status"] == "succeeded" and bodies["held"]["status"] == "succeeded"
    assert bodies["dev"]["outputs"] == [expected_vector("on A's device")]
    assert {b["worker"] for b in bodies.values()} == {"B"}  # B really produced both results
    attempts = {
        k: decode_job(stack.r.hgetall(keys.job(b["id"]))).attempts for k, b in bodies.items()
    }
    assert attempts == {"dev": 2, "held": 1}, attempts  # A's start counts; A's holding does not
    assert took < 15, f"take-over took {took:.1f}s"


def test_poison_job_is_dead_lettered_and_healthy_jobs_survive(stack: Stack) -> None:
    spec = "crashy=tests.fixtures.models:CrashEcho"
    settings = {"models": "crashy", "max_deliveries": 3, "max_wait_ms": 100}
    base = stack.api(model="crashy", models="crashy")
    bad = _post(base, {"input": "crash now"}).json()
    good = [_post(base, {"input": f"fine {i}"}).json() for i in range(4)]
    for _ in range(6):  # each delivery of the poison job kills the worker; restart it
        w = stack.worker(model=spec, worker_id="P", wait=False, **settings)
        deadline = time.monotonic() + 20
        while w.alive() and time.monotonic() < deadline:
            if _job(base, bad["id"])["status"] == "failed":
                break
            time.sleep(0.05)
        if _job(base, bad["id"])["status"] == "failed":
            break
    body = _job(base, bad["id"])
    assert body["status"] == "failed" and body["error"]["code"] == "poisoned", body
    dead = stack.r.xrange(keys.dead("crashy"))
    assert [e[1][b"job"].decode() for e in dead] == [bad["id"]]
    if not w.alive():
        stack.worker(model=spec, worker_id="P", **settings)
    for g in good:
        assert _job(base, g["id"], wait=15)["status"] == "succeeded"


def test_deadline_expires_before_the_model(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=1500, max_batch_size=1)
    base = stack.api()
    first = _post(base, {"input": "occupies the worker"}).json()
    wait_for(lambda: _job(base, first["id"])["status"] == "running", 10, "the first job to start")
    late = _post(base, {"input": "too late", "timeout_s": 0.3}).json()
    body = _job(base, late["id"], wait=10)
    assert body["status"] == "expired" and body["error"]["code"] == "expired"
    assert body["timings"]["batch_size"] is None  # never reached the model
    assert _job(base, first["id"], wait=10)["status"] == "succeeded"


def test_cancel_queued_job_and_409_once_ended(stack: Stack) -> None:
    base = stack.api()  # no worker yet: the job waits
    job = _post(base, {"inputs": ["a", "b"]}).json()
    r = httpx.delete(f"{base}/v1/jobs/{job['id']}", timeout=5)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert httpx.delete(f"{base}/v1/jobs/{job['id']}", timeout=5).status_code == 409
    stack.worker()
    wait_for(lambda: stack.r.xlen(keys.stream("echo")) == 0, 10, "the cancelled entry to be acked")
    assert _job(base, job["id"])["status"] == "cancelled"
    assert httpx.delete(f"{base}/v1/jobs/unknown", timeout=5).status_code == 404


def test_client_disconnect_cancels_unstarted_infer(stack: Stack) -> None:
    base = stack.api()
    headers = {"Idempotency-Key": "disconnect-1"}
    try:
        _post(base, {"input": "nobody waits"}, "/v1/infer", headers=headers, timeout=0.5)
        raise AssertionError("expected the client to time out")
    except httpx.TimeoutException:
        pass
    again = _post(base, {"input": "nobody waits"}, headers=headers).json()  # same key, same job
    wait_for(
        lambda: _job(base, again["id"])["status"] == "cancelled", 10, "the job to be cancelled"
    )


def test_queue_cap_answers_429_with_computed_retry_after(stack: Stack) -> None:
    base = stack.api(max_queue=5)
    for _ in range(5):
        assert _post(base, {"input": "x"}).status_code == 202
    for path in ("/v1/jobs", "/v1/infer"):
        r = _post(base, {"inputs": ["x", "y"]}, path)
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert "INFERQ_MAX_QUEUE=5" in r.json()["error"]["message"]


def test_deadline_aware_admission(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=100, max_batch_size=1)
    base = stack.api()
    ids = [_post(base, {"input": f"warm {i}"}).json()["id"] for i in range(15)]
    wait_for(lambda: _job(base, ids[10])["status"] == "succeeded", 20, "a measured throughput")
    for i in range(40):
        _post(base, {"input": f"backlog {i}"})
    r = _post(base, {"input": "needs it now", "timeout_s": 0.5})
    assert r.status_code == 429, r.text
    assert "deadline" in r.json()["error"]["message"] and int(r.headers["retry-after"]) >= 1


def test_priorities_serve_high_first_without_starving_low(stack: Stack) -> None:
    base = stack.api()
    order: dict[str, list[str]] = {"high": [], "normal": [], "low": []}
    for i in range(12):
        for lane in ("low", "normal", "high"):
            order[lane].append(_post(base, {"input": f"{lane} {i}", "priority": lane}).json()["id"])
    stack.worker(max_batch_size=1, prefetch_items=1, echo_batch_delay_ms=10)
    finished: dict[str, int] = {}
    for job_id in [j for ids in order.values() for j in ids]:
        assert _job(base, job_id, wait=30)["status"] == "succeeded"
        finished[job_id] = stack_finished(stack, job_id)
    mean = {lane: sum(finished[j] for j in ids) / len(ids) for lane, ids in order.items()}
    assert mean["high"] < mean["normal"] < mean["low"], mean
    last_high = max(finished[j] for j in order["high"])
    assert min(finished[j] for j in order["low"]) < last_high, "low lane starved"


def stack_finished(stack: Stack, job_id: str) -> int:
    from inferq.shared.jobs import decode_job

    job = decode_job(stack.r.hgetall(keys.job(job_id)))
    assert job.finished_ms is not None
    return job.finished_ms


async def test_idempotency_key_racing_submits_create_one_job(stack: Stack) -> None:
    base = stack.api()
    async with httpx.AsyncClient(timeout=10) as c:
        replies = await asyncio.gather(
            *(
                c.post(
                    f"{base}/v1/jobs", json={"input": "once"}, headers={"Idempotency-Key": "race"}
                )
                for _ in range(16)
            )
        )
    assert {r.status_code for r in replies} == {202}
    assert len({r.json()["id"] for r in replies}) == 1
    assert stack.r.xlen(keys.stream("echo")) == 1


def test_queue_position_and_eta(stack: Stack) -> None:
    base = stack.api()
    ids = [_post(base, {"input": f"q {i}"}).json()["id"] for i in range(3)]
    high = _post(base, {"input": "urgent", "priority": "high"}).json()["id"]
    assert _job(base, ids[0])["position"] == 1  # the high job is ahead of it
    assert _job(base, ids[2])["position"] == 3
    assert _job(base, high)["position"] == 0
    assert "eta_ms" in _job(base, ids[2])


def test_auth_and_tenant_isolation(stack: Stack) -> None:
    base = stack.api(
        api_keys="alpha:key-alpha-123-0123456789,beta:key-beta-456-0123456789",
        admin_keys="ops:key-ops-789-0123456789",
    )
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    assert _post(base, {"input": "x"}).status_code == 401
    bad = _post(base, {"input": "x"}, headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
    alpha = {"Authorization": "Bearer key-alpha-123-0123456789"}
    beta = {"Authorization": "Bearer key-beta-456-0123456789"}
    job = _post(base, {"input": "secret"}, headers=alpha).json()
    assert httpx.get(f"{base}/v1/jobs/{job['id']}", headers=alpha, timeout=5).status_code == 200
    assert httpx.get(f"{base}/v1/jobs/{job['id']}", headers=beta, timeout=5).status_code == 404
    assert httpx.delete(f"{base}/v1/jobs/{job['id']}", headers=beta, timeout=5).status_code == 404
    ops = {"Authorization": "Bearer key-ops-789-0123456789"}
    for path in ("/v1/health", "/v1/models", "/metrics"):
        assert httpx.get(f"{base}{path}", timeout=5).status_code == 401, path
        assert httpx.get(f"{base}{path}", headers=ops, timeout=5).status_code in (200, 503), path
    # The operator's routes are not a tenant's: 403 names the admin key it would need.
    for path in ("/v1/health", "/metrics"):
        r = httpx.get(f"{base}{path}", headers=beta, timeout=5)
        assert r.status_code == 403 and "INFERQ_ADMIN_KEYS" in r.json()["error"]["message"], path
    # A tenant sees the models, not the workers' hosts and PIDs; the operator sees both.
    mine = httpx.get(f"{base}/v1/models", headers=beta, timeout=5).json()["models"]
    assert all("workers" not in m and "target" not in m for m in mine)
    theirs = httpx.get(f"{base}/v1/models", headers=ops, timeout=5).json()["models"]
    assert all("workers" in m and "target" in m for m in theirs)
    assert httpx.get(f"{base}/openapi.json", timeout=5).status_code == 404
    assert httpx.get(f"{base}/readyz", timeout=5).status_code in (200, 503)
    assert (
        "key-alpha-123-0123456789" not in stack.logs()
        and "key-beta-456-0123456789" not in stack.logs()
    )
    assert "key-ops-789-0123456789" not in stack.logs()


def test_redis_outage_gives_503_and_recovers(stack: Stack, redis_server) -> None:  # type: ignore[no-untyped-def]
    stack.worker()
    base = stack.api(redis_timeout_s=0.5)
    assert _post(base, {"input": "before"}, "/v1/infer").status_code == 200
    redis_server.stop()
    try:
        t0 = time.monotonic()
        r = _post(base, {"input": "during"})
        assert r.status_code == 503 and "retry-after" in r.headers
        assert time.monotonic() - t0 < 5
        ready = httpx.get(f"{base}/readyz", timeout=5)
        # Unauthenticated: it says Redis is down, never where Redis is.
        assert ready.status_code == 503 and ready.json()["reason"] == "redis unreachable"
        assert str(redis_server.port) not in ready.text and "Error" not in ready.text
    finally:
        redis_server.start()
    wait_for(
        lambda: _post(base, {"input": "after"}, "/v1/infer").status_code == 200, 30, "recovery"
    )


def test_password_protected_redis_and_no_secret_in_logs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from inferq.redis_server import RedisServer

    secret = "s3cret-redis-pass"
    server = RedisServer(tmp_path / "redis", password=secret)
    server.start()
    stack = Stack(server.url, tmp_path)
    try:
        stack.worker()
        base = stack.api()
        r = _post(base, {"input": "behind a password"}, "/v1/infer")
        assert r.status_code == 200 and r.json()["status"] == "succeeded"
        assert secret not in stack.logs()
    finally:
        stack.close()
        server.stop()


def test_deadline_ends_queued_job_even_with_no_worker(stack: Stack) -> None:
    base = stack.api(max_queue=3)
    job = _post(base, {"inputs": ["a", "b", "c"], "timeout_s": 0.2}).json()
    assert _post(base, {"input": "blocked by the cap"}).status_code == 429
    wait_for(lambda: _job(base, job["id"])["status"] == "expired", 10, "the job to expire")
    assert _post(base, {"input": "room again"}).status_code == 202  # its items left the count
