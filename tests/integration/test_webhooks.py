"""Completion webhooks against real processes: a receiver on 127.0.0.1 in a thread, real
Redis, echo workers and API servers. Retries and signatures, a cancelled job, the SSRF guard
at submit, an API killed mid-delivery, dead letters; then the scripts that make promotion
and settling safe between API processes (and keep the tenant's count of unsettled
deliveries), a delivery made after its job record expired, and the take-over's delivery cap.
Fairness between targets (a tarpit beside a live receiver) is `test_webhook_fairness`."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from inferq.api.webhooks.contract import Delivery
from inferq.api.webhooks.dispatcher import Dispatcher
from inferq.api.webhooks.poster import Poster
from inferq.shared import keys, lua
from inferq.shared.jobs import ErrorCode, Job, JobError, Status, encode_final
from inferq.shared.lua.webhooks import PROMOTE, SETTLE
from inferq.shared.metrics import api_metrics
from inferq.shared.redis_clients import pubsub_client
from inferq.shared.settings import Settings
from tests.integration.receivers import HookServer
from tests.integration.stack import Stack, wait_for
from tests.queues import JobQueue

SECRET = "whsec-integration"
# The stack serves one model, "echo", on one queue shard: its delivery keys.
STREAM, RETRY, DEAD = keys.webhooks("echo"), keys.webhook_retry("echo"), keys.webhook_dead("echo")
# The tenant of an open API (no INFERQ_API_KEYS): its counter of unsettled deliveries.
COUNTER = keys.tenant_webhooks("echo", 0, 1, "")
# Fast retries; an attempt gives up after 1 s, so a dead API's entry is taken over after 4 s.
# Every path of the receiver is one target, so its failing paths would open the circuit for
# the others (as they should: one receiver). These tests count attempts and retries, so the
# breaker is off here; `test_webhook_fairness` and the unit tests exercise it.
HOOKS = {
    "webhook_secret": SECRET,
    "webhook_allow": "127.0.0.1",
    "webhook_backoff_s": 0.05,
    "webhook_timeout_s": 1,
    "webhook_breaker_failures": 1000,
}


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered; 0: held, never answered

    @property
    def job(self) -> str:
        return str(json.loads(self.body)["id"])

    @property
    def delivery(self) -> str:
        return self.headers["x-inferq-delivery"]


class Receiver:
    """Answers by path: /ok 200; /flaky 500 twice, then 200; /fail 500 while `failing`, then
    200; /gone 410; /hang holds its first request until `release` (never answering it), then
    as /fail."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self.lock = threading.Lock()
        self.failing = True
        self.flaky_left = 2
        self.held = threading.Event()
        self.release = threading.Event()
        self.hook = HookServer(self._answer)

    def url(self, path: str) -> str:
        return self.hook.url(path)

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            first_hang = path == "/hang" and not self.held.is_set()
            if first_hang:
                status = 0
                self.held.set()
            elif path == "/ok":
                status = 200
            elif path == "/flaky":
                status = 500 if self.flaky_left > 0 else 200
                self.flaky_left -= 1
            elif path == "/gone":
                status = 410
            else:
                status = 500 if self.failing else 200
            self.hits.append(Hit(path, {k.lower(): v for k, v in headers.items()}, body, status))
        if first_hang:
            self.release.wait(30)  # the sender is killed meanwhile; nobody reads an answer
        return status

    def of(self, job_id: str, status: int | None = None) -> list[Hit]:
        with self.lock:
            return [h for h in self.hits if h.job == job_id and status in (None, h.status)]

    def close(self) -> None:
        self.release.set()
        self.hook.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _submit(base: str, url: str, text: str = "hook me") -> str:
    r = httpx.post(f"{base}/v1/jobs", json={"input": text, "webhook": {"url": url}}, timeout=10)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _get(base: str, job_id: str) -> dict:  # type: ignore[type-arg]
    r = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10)
    assert r.status_code == 200, r.text
    return {k: v for k, v in r.json().items() if k not in ("position", "eta_ms")}


def _verified(hit: Hit) -> bool:
    """The recipe of docs/api.md: HMAC over `<timestamp>.<delivery id>.<body>`."""
    ts, delivery = hit.headers["x-inferq-timestamp"], hit.headers["x-inferq-delivery"]
    signed = f"{ts}.{delivery}.".encode() + hit.body
    mac = hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(hit.headers["x-inferq-signature"], f"sha256={mac}")


def _settled(stack: Stack) -> bool:
    """Nothing in the stream (new or in flight) and nothing waiting to retry."""
    return stack.r.xlen(STREAM) == 0 and stack.r.zcard(RETRY) == 0


def _deliveries(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return {
        s.labels["outcome"]: s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "inferq_webhook_deliveries"
        for s in fam.samples
        if s.name.endswith("_total")
    }


def _health_hooks(base: str) -> dict[str, int]:
    return httpx.get(f"{base}/v1/health", timeout=5).json()["webhooks"]  # type: ignore[no-any-return]


def test_retried_until_delivered_once_signed_and_equal_to_get(
    stack: Stack, receiver: Receiver
) -> None:
    stack.worker()
    base = stack.api(**HOOKS)
    job_id = _submit(base, receiver.url("/flaky"))
    wait_for(lambda: receiver.of(job_id, 200), 20, "a successful delivery")
    wait_for(lambda: _settled(stack), 10, "the delivery to be settled")
    hits = receiver.of(job_id)
    assert [h.status for h in hits] == [500, 500, 200]
    assert len({h.delivery for h in hits}) == 1  # one delivery, three attempts
    assert all(_verified(h) for h in hits)
    assert all(h.body == hits[0].body for h in hits)  # the snapshot travels with the retries
    assert hits[0].headers["content-type"] == "application/json"
    view = _get(base, job_id)
    assert view["status"] == "succeeded" and json.loads(hits[-1].body) == view
    assert _deliveries(base) == {"delivered": 1.0, "retried": 2.0}
    assert _health_hooks(base) == {"queued": 0, "retrying": 0, "dead": 0}
    assert int(stack.r.get(COUNTER) or 0) == 0  # FINISH counted it up, the delivery down


def test_cancelled_job_is_delivered_and_internal_targets_are_refused(
    stack: Stack, receiver: Receiver
) -> None:
    base = stack.api(**HOOKS)  # no worker: the job waits until cancelled
    job_id = _submit(base, receiver.url("/ok"))
    r = httpx.delete(f"{base}/v1/jobs/{job_id}", timeout=5)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    (hit,) = wait_for(lambda: receiver.of(job_id, 200), 10, "the cancelled job's delivery")
    body = json.loads(hit.body)
    assert body == _get(base, job_id) and body["error"]["code"] == "cancelled" and _verified(hit)

    for url, rule in [
        ("http://10.0.0.1/x", "webhook host 10.0.0.1 is a private address; allow it with INFERQ_WEBHOOK_ALLOW"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is the cloud metadata address"),
        ("http://[::1]/x", "::1 is a loopback address"),
        ("ftp://127.0.0.1/x", "scheme 'ftp'"),
    ]:  # fmt: skip
        r = httpx.post(f"{base}/v1/jobs", json={"input": "x", "webhook": {"url": url}}, timeout=5)
        assert r.status_code == 422 and rule in r.json()["error"]["message"], r.text
    strict = stack.api(webhook_secret=SECRET)  # no allow-list: the receiver itself is refused
    r = httpx.post(
        f"{strict}/v1/jobs", json={"input": "x", "webhook": {"url": receiver.url("/ok")}}, timeout=5
    )
    assert r.status_code == 422 and "127.0.0.1 is a loopback address" in r.text
    assert stack.r.keys(keys.job("*")) == [keys.job(job_id).encode()]  # none stored
    assert len(receiver.hits) == 1  # and no connection was made for any refused one


def test_deliveries_survive_an_api_killed_mid_delivery(stack: Stack, receiver: Receiver) -> None:
    """One delivery is in flight (the receiver holds it) and one is failing with 500s when
    the API is SIGKILLed; a new API takes the first over and promotes the second."""
    stack.worker()
    base = stack.api(**HOOKS)
    failing = _submit(base, receiver.url("/fail"), "failing")
    wait_for(lambda: len(receiver.of(failing)) >= 2, 20, "the failing delivery to be retried")
    held = _submit(base, receiver.url("/hang"), "held")
    wait_for(receiver.held.is_set, 20, "the held delivery to reach the receiver")
    api = next(p for p in stack.procs if p.name == "api")
    api.popen.kill()  # well within the held attempt's 1 s timeout
    api.wait(10)
    pending = stack.r.xpending_range(STREAM, keys.WEBHOOK_GROUP, "-", "+", 10)
    in_flight = [stack.r.xrange(STREAM, p["message_id"], p["message_id"]) for p in pending]
    # The held delivery is in the dead consumer's pending list: only a take-over can finish it.
    assert held.encode() in [f.get(b"job") for e in in_flight for f in _fields(e)]
    receiver.failing = False
    receiver.release.set()
    stack.api(**HOOKS)
    for job_id in (held, failing):
        wait_for(partial(receiver.of, job_id, 200), 20, f"job {job_id} delivered after restart")
    wait_for(lambda: _settled(stack), 10, "everything settled")
    for job_id in (held, failing):
        hits = receiver.of(job_id)
        assert len({h.delivery for h in hits}) == 1 and len(receiver.of(job_id, 200)) == 1
        assert all(_verified(h) for h in hits)
    assert [h.status for h in receiver.of(held)] == [0, 200]  # held, then taken over


def test_dead_letters_after_max_age_and_on_refusal(stack: Stack, receiver: Receiver) -> None:
    stack.worker()
    base = stack.api(**HOOKS | {"webhook_max_age_s": 1})
    failing = _submit(base, receiver.url("/fail"), "always 500")
    gone = _submit(base, receiver.url("/gone"), "410")
    wait_for(lambda: _health_hooks(base)["dead"] == 2, 15, "two dead letters in /v1/health")
    dead = {e[b"job"].decode(): e for e in _fields(stack.r.xrange(DEAD))}
    assert set(dead) == {failing, gone}
    assert "INFERQ_WEBHOOK_MAX_AGE_S=1:" in dead[failing][b"reason"].decode()
    assert dead[gone][b"reason"] == b"HTTP 410" and len(receiver.of(gone)) == 1  # at once
    record = Delivery.unpack(dead[failing][b"delivery"])
    attempts = receiver.of(failing)
    assert record.attempts == len(attempts) >= 2 and record.error == "HTTP 500"
    assert json.loads(record.body) == _get(base, failing)  # kept for a replay
    assert _deliveries(base) == {"dead": 2.0, "retried": float(len(attempts) - 1)}
    assert _settled(stack)
    assert int(stack.r.get(COUNTER) or 0) == 0  # dead is settled for good too


# --- the scripts and the take-over cap, in process ------------------------------------------------


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    await r.xgroup_create(STREAM, keys.WEBHOOK_GROUP, id="0", mkstream=True)
    yield r
    await r.aclose()


async def test_racing_promoters_move_each_due_retry_exactly_once(
    redis: Redis, redis_url: str
) -> None:
    records = {f"record-{i}".encode(): 0 for i in range(300)}  # all due
    await redis.zadd(RETRY, records)  # type: ignore[arg-type]
    await redis.zadd(RETRY, {b"later": 2**50})
    clients = [Redis.from_url(redis_url) for _ in range(4)]
    promote = [c.register_script(lua.source(PROMOTE)) for c in clients]
    script_keys = [RETRY, STREAM]
    await asyncio.gather(*(p(keys=script_keys, args=[7]) for p in promote for _ in range(15)))
    moved = [f[b"delivery"] for f in _fields(await redis.xrange(STREAM))]
    assert sorted(moved) == sorted(records)  # every due one, none twice
    assert await redis.zrange(RETRY, 0, -1) == [b"later"]
    for c in clients:
        await c.aclose()


async def test_settle_only_by_the_consumer_that_holds_the_entry(redis: Redis) -> None:
    stream, group = STREAM, keys.WEBHOOK_GROUP
    await redis.xadd(stream, {"job": "j1"})
    entry_id = _first_id(await redis.xreadgroup(group, "slow", {stream: ">"}, count=1))
    await redis.xautoclaim(stream, group, "taker", 0, count=1)  # the slow one lost it
    settle = redis.register_script(lua.source(SETTLE))
    script_keys = [stream, RETRY, DEAD]
    late = await settle(keys=script_keys, args=[group, "slow", entry_id, "retry", 10, b"rec"])
    assert late == 0 and await redis.zcard(RETRY) == 0
    args = [group, "taker", entry_id, "dead", 100, "j1", b"rec", "HTTP 410"]
    assert await settle(keys=script_keys, args=args) == 1
    assert await redis.xlen(DEAD) == 1 and await redis.xlen(stream) == 0
    assert (await redis.xpending(stream, group))["pending"] == 0


async def test_settle_counts_the_tenant_down_when_settled_for_good_only(redis: Redis) -> None:
    """Done or dead: one down (never below 0, never created); a retry (or a deferral): not."""
    stream, group, counter = STREAM, keys.WEBHOOK_GROUP, keys.tenant_webhooks("echo", 0, 1, "acme")
    settle = redis.register_script(lua.source(SETTLE))
    await redis.set(counter, 2)

    async def settled(mode: str, *args: bytes | str | int, tenant_key: bool = True) -> int:
        await redis.xadd(stream, {"job": "j"})
        entry_id = _first_id(await redis.xreadgroup(group, "me", {stream: ">"}, count=1))
        script_keys = [stream, RETRY, DEAD] + ([counter] if tenant_key else [])
        assert await settle(keys=script_keys, args=[group, "me", entry_id, mode, *args]) == 1
        return int(await redis.get(counter) or -1)

    assert await settled("retry", 10, b"r1") == 2
    assert await settled("done") == 1
    assert await settled("retry", 10, b"r2", tenant_key=False) == 1
    assert await settled("dead", 100, "j", b"r", "HTTP 410") == 0
    assert await settled("done") == 0  # floor: a spare settle never goes negative
    await redis.delete(counter)
    assert await settled("dead", 100, "j", b"r", "HTTP 410") == -1  # and creates nothing
    assert await redis.zcard(RETRY) == 2 and await redis.xlen(DEAD) == 2


async def test_a_delivery_needs_no_job_record(redis: Redis, redis_url: str) -> None:
    """FINISH queues the final record with the delivery: the job record may be long gone
    (INFERQ_RESULT_TTL_S) by the first attempt, and the receiver still gets the job."""
    settings = Settings(model="echo", webhook_secret=SECRET, webhook_allow="127.0.0.1")
    queue = JobQueue(redis, result_ttl_s=60)
    job = Job(
        id="gone",
        model="echo",
        inputs=["x"],
        tenant="acme",
        webhook={"url": "http://127.0.0.1:9/h"},
    )
    await queue.submit(job)
    final = encode_final(Status.CANCELLED, finished_ms=1, error=JobError(ErrorCode.CANCELLED, "c"))
    await queue.cancel(job, final, only_if_queued=False)  # FINISH: the entry, counted up
    counter = keys.tenant_webhooks("echo", 0, 1, "acme")
    assert await redis.get(counter) == b"1"
    await redis.delete(keys.job(job.id))  # expired
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(204)

    poster = Poster(settings, transport=httpx.MockTransport(answer))
    blocking = pubsub_client(redis_url, connect_timeout_s=2)
    dispatcher = Dispatcher(settings, queue, blocking, api_metrics(), poster=poster)
    dispatcher.start()
    try:
        await asyncio.wait_for(_until(lambda: _zero(redis.xlen(STREAM))), 10)
    finally:
        await dispatcher.stop()
    [body] = bodies
    assert body["id"] == "gone" and body["status"] == "cancelled"
    assert body["error"]["code"] == "cancelled" and await redis.xlen(DEAD) == 0
    assert await redis.get(counter) == b"0"


async def test_the_retry_window_starts_at_the_first_attempt(redis: Redis, redis_url: str) -> None:
    """A job that ended two days before its delivery's first attempt (a backlog, an outage)
    still gets INFERQ_WEBHOOK_MAX_AGE_S of retries, counted from that first attempt."""
    settings = Settings(model="echo", webhook_secret=SECRET, webhook_max_age_s=60)
    now = int(time.time() * 1000)
    job = Job(id="late", model="echo", inputs=["x"], status=Status.SUCCEEDED, finished_ms=now)
    d = Delivery.of(job, "1-0", "https://8.8.8.8/h")
    late = Delivery(**{**_as_fields(d), "ended_ms": now - 2 * 86_400_000, "first_ms": now})
    await redis.xadd(STREAM, {"delivery": late.pack()})
    poster = Poster(settings, transport=httpx.MockTransport(lambda _: httpx.Response(503)))
    blocking = pubsub_client(redis_url, connect_timeout_s=2)
    dispatcher = Dispatcher(
        settings,
        queue=JobQueue(redis, result_ttl_s=60),
        blocking=blocking,
        metrics=api_metrics(),
        poster=poster,
    )
    dispatcher.start()
    try:
        await asyncio.wait_for(_until(lambda: _zero(redis.xlen(STREAM))), 10)
    finally:
        await dispatcher.stop()
    assert await redis.xlen(DEAD) == 0
    [record] = await redis.zrange(RETRY, 0, -1)
    again = Delivery.unpack(record)
    assert again.attempts == 1 and again.first_ms == now and again.error == "HTTP 503"


def _as_fields(d: Delivery) -> dict[str, Any]:
    return {name: getattr(d, name) for name in d.__slots__}  # type: ignore[attr-defined]


async def _zero(n: Awaitable[int]) -> int:
    return int(await n == 0)


async def test_an_entry_taken_over_too_often_is_dead_lettered_unattempted(
    redis: Redis, redis_url: str
) -> None:
    settings = Settings(model="echo", webhook_secret=SECRET, webhook_timeout_s=0.05)
    queue = JobQueue(redis, result_ttl_s=60)
    job = Job(id="crashy", model="echo", inputs=["x"], webhook={"url": "https://8.8.8.8/h"})
    await queue.submit(job)
    error = JobError(ErrorCode.CANCELLED, "cancelled")
    final = encode_final(Status.CANCELLED, finished_ms=1, error=error)
    await queue.cancel(job, final, only_if_queued=False)  # FINISH queues the delivery
    stream, group = STREAM, keys.WEBHOOK_GROUP
    entry_id = _first_id(await redis.xreadgroup(group, "crashed", {stream: ">"}, count=1))
    # As if four deliverers had died holding it (delivered 5 times) and it idled since: the
    # next take-over is its sixth delivery, one past MAX_DELIVERIES.
    await redis.xclaim(stream, group, "crashed", 0, [entry_id], idle=60_000, retrycount=5)
    calls: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200)

    poster = Poster(settings, transport=httpx.MockTransport(answer))
    blocking = pubsub_client(redis_url, connect_timeout_s=2)  # what the app gives it
    dispatcher = Dispatcher(settings, queue, blocking, api_metrics(), poster=poster)
    dispatcher.start()
    try:
        await asyncio.wait_for(_until(lambda: redis.xlen(DEAD)), 10)
    finally:
        await dispatcher.stop()
    [fields] = _fields(await redis.xrange(DEAD))
    assert fields[b"job"] == b"crashy" and b"taken over 5 times" in fields[b"reason"]
    assert calls == [] and await redis.xlen(stream) == 0


async def _until(read: Callable[[], Awaitable[int]]) -> None:
    for _ in range(500):
        if await read():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


def _fields(entries: Any) -> list[dict[bytes, bytes]]:
    """XRANGE's entries, fields only."""
    return [fields for _, fields in entries]


def _first_id(reply: Any) -> str:
    """The first entry id of an XREADGROUP reply."""
    return str(reply[0][1][0][0].decode())
