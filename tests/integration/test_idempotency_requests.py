"""An Idempotency-Key is bound to its request (issue 28, item 9): reused with a different one
it is refused (422) on every route, never answered with the other request's job; and a
request only ever cancels a job it created, never one it got back as a repeat."""

from __future__ import annotations

import httpx
import pytest

from inferq.shared import keys
from inferq.shared.jobs import Job
from inferq.shared.queue import Idempotency
from tests.integration.stack import Stack, wait_for
from tests.queues import JobQueue

FP_A, FP_B = "a" * 64, "b" * 64


async def test_the_scripts_bind_a_key_to_its_fingerprint(queue: JobQueue) -> None:
    first = await queue.submit(
        Job(id="k1", model="echo", inputs=["x"]), idempotency=Idempotency("h", fingerprint=FP_A)
    )
    again = await queue.submit(
        Job(id="k2", model="echo", inputs=["x"]), idempotency=Idempotency("h", fingerprint=FP_A)
    )
    other = await queue.submit(
        Job(id="k3", model="echo", inputs=["y"]), idempotency=Idempotency("h", fingerprint=FP_B)
    )
    assert first.outcome == "created"
    assert (again.outcome, again.job_id) == ("duplicate", "k1")
    assert (other.outcome, other.job_id) == ("conflict", "k1")
    assert await queue.get("k2") is None and await queue.get("k3") is None
    # A key written without a fingerprint (before this change) still finds its job.
    await queue.redis.set(keys.idempotency("", "old", "echo"), "k0")
    legacy = await queue.submit(
        Job(id="k4", model="echo", inputs=["z"]), idempotency=Idempotency("old", fingerprint=FP_B)
    )
    assert (legacy.outcome, legacy.job_id) == ("duplicate", "k0")
    # A job answered from the cache binds its key the same way.
    fields = {"status": b"x"}
    cached = await queue.record_cached(
        Job(id="c1", model="echo", inputs=["x"]),
        fields,
        idempotency=Idempotency("hc", fingerprint=FP_A),
    )
    repeat = await queue.record_cached(
        Job(id="c2", model="echo", inputs=["x"]),
        fields,
        idempotency=Idempotency("hc", fingerprint=FP_A),
    )
    clash = await queue.record_cached(
        Job(id="c3", model="echo", inputs=["y"]),
        fields,
        idempotency=Idempotency("hc", fingerprint=FP_B),
    )
    assert cached.outcome == "created" and (repeat.outcome, repeat.job_id) == ("duplicate", "c1")
    assert (clash.outcome, clash.job_id) == ("conflict", "c1")


ROUTES = {
    "/v1/jobs": lambda text: {"input": text},
    "/v1/infer": lambda text: {"input": text, "wait": 0},
    "/v1/embeddings": lambda text: {"input": text, "wait": 0},
    "/v2/models/echo/infer": lambda text: {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]
    },
}


def test_a_key_reused_with_another_request_is_422_on_every_route(stack: Stack) -> None:
    base = stack.api(sync_wait_s=0.2)  # no worker: the first job stays queued
    key = {"Idempotency-Key": "bound"}
    first = httpx.post(f"{base}/v1/jobs", json={"input": "first"}, headers=key, timeout=10)
    assert first.status_code == 202
    for path, body in ROUTES.items():
        r = httpx.post(f"{base}{path}", json=body("second"), headers=key, timeout=10)
        assert r.status_code == 422, (path, r.text)
        error = r.json()["error"]
        message = error if path.startswith("/v2") else error["message"]
        assert "different request" in message and first.json()["id"] in message, (path, r.text)
    # The same request on another route (other lane, other deadline) is the same job.
    again = httpx.post(
        f"{base}/v1/infer", json={"input": "first", "wait": 0, "priority": "low"}, headers=key
    )
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"], again.text
    assert stack.r.xlen(keys.stream("echo")) == 1


def test_a_v2_repeat_never_cancels_the_first_job(stack: Stack) -> None:
    """/v2 cancels its job when the client leaves, or when the wait ends (the protocol cannot
    fetch it later): but only a job it created. A repeat of another request's key leaves
    that job queued, whether it waits out its time or its client leaves."""
    base = stack.api(sync_wait_s=0.3)  # no worker: nothing starts a job
    url = f"{base}/v2/models/echo/infer"
    key = {"Idempotency-Key": "first-owns-it"}
    first = httpx.post(f"{base}/v1/jobs", json={"input": "mine"}, headers=key, timeout=10).json()
    late = httpx.post(url, json=ROUTES["/v2/models/echo/infer"]("mine"), headers=key, timeout=10)
    assert late.status_code == 429 and "left to the request that made it" in late.text
    status = httpx.get(f"{base}/v1/jobs/{first['id']}", timeout=5).json()["status"]
    assert status == "queued"
    # A repeat whose client leaves; then one of its own (another key) whose client leaves:
    # once the API has cancelled that one, it has long handled the repeat's departure.
    slow = stack.api(sync_wait_s=60)
    slow_url = f"{slow}/v2/models/echo/infer"
    for headers in (key, {"Idempotency-Key": "its-own"}):
        with pytest.raises(httpx.TimeoutException):
            httpx.post(
                slow_url, json=ROUTES["/v2/models/echo/infer"]("mine"), headers=headers, timeout=0.5
            )
    own = httpx.post(
        f"{slow}/v1/jobs", json={"input": "mine"}, headers={"Idempotency-Key": "its-own"}
    ).json()

    def own_cancelled() -> bool:
        return httpx.get(f"{slow}/v1/jobs/{own['id']}", timeout=5).json()["status"] == "cancelled"

    wait_for(own_cancelled, 10, "the request's own job to be cancelled")
    assert httpx.get(f"{base}/v1/jobs/{first['id']}", timeout=5).json()["status"] == "queued"
