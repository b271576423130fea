"""One entry from read to settled (`webhooks.delivery.Deliverer`) with plain objects: a
recorder for SETTLE (fakeredis runs no Lua), a fake transport for the POSTs and a clock
that moves only when the test moves it. Then the dispatcher's loops outliving errors."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from typing import Any

import fakeredis
import httpx
import msgpack
import numpy as np
import pytest

from inferq.api.webhooks import store
from inferq.api.webhooks.contract import Delivery, body_of
from inferq.api.webhooks.delivery import Deliverer, Pace
from inferq.api.webhooks.dispatcher import Dispatcher
from inferq.api.webhooks.poster import Poster
from inferq.api.webhooks.targets import Ticket, target_of
from inferq.shared import keys
from inferq.shared.jobs import Job, Status, encode_final, encode_submit, now_ms, pack_field
from inferq.shared.metrics import ApiMetrics, api_metrics
from inferq.shared.schema import JobField
from inferq.shared.settings import Settings
from tests.queues import JobQueue

SECRET = "s3cret-for-tests"
URL = "https://93.184.216.34/hook"  # an IP literal: no lookup
SHARD = store.Shard.of("echo", 0, 1)


def _settings(**kw: object) -> Settings:
    return Settings(model="echo", webhook_secret=SECRET, **kw)  # type: ignore[arg-type]


def _job(job_id: str = "echo.0.j1", url: str = URL) -> Job:
    return Job(
        id=job_id, model="echo", inputs=["a"], status=Status.SUCCEEDED, tenant="acme",
        created_ms=1_000, started_ms=1_010, finished_ms=1_030,
        outputs=np.ones((1, 4), dtype=np.float32), webhook={"url": url},
    )  # fmt: skip


def _record(job: Job) -> bytes:
    """What FINISH puts beside the job id: the final record's flat list, without inputs."""
    fields = encode_submit(job) | encode_final(
        job.status, finished_ms=job.finished_ms or 0, outputs=job.outputs
    )
    del fields[JobField.INPUTS]
    fields[JobField.STARTED_MS] = pack_field(job.started_ms)  # START wrote it
    return msgpack.packb([x for k, v in fields.items() for x in (k.encode(), v)])  # type: ignore[no-any-return]


class Settled:
    """SETTLE, recorded: (mode, args, tenant) per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], str | None]] = []

    async def settle(
        self,
        shard: store.Shard,
        consumer: str,
        entry_id: str,
        mode: str,
        *args: bytes | str | int,
        tenant: str | None = None,
    ) -> bool:
        assert shard == SHARD and consumer == "me"
        self.calls.append((mode, args, tenant))
        return True

    @property
    def last(self) -> tuple[str, tuple[Any, ...], str | None]:
        return self.calls[-1]


REFUSED = 0  # the fake receiver's "status" for a connection refused: nobody listening


class Receiver:
    """A fake transport: answers `status` (`REFUSED`: refuses the connection) and keeps the
    requests."""

    def __init__(self, status: int = 204) -> None:
        self.status = status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status == REFUSED:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(self.status)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Rig:
    def __init__(self, **settings: object) -> None:
        self.settings = _settings(**settings)
        self.redis = fakeredis.FakeAsyncRedis()
        self.receiver = Receiver()
        self.settled = Settled()
        self.clock = Clock()
        self.scheduled: list[int] = []
        self.metrics = api_metrics()
        self.poster = Poster(self.settings, transport=httpx.MockTransport(self.receiver))
        self.deliverer = Deliverer(
            self.settings,
            JobQueue(self.redis, result_ttl_s=60),
            self.settled,
            "me",
            self.metrics,
            self.poster,
            Pace(scheduled=self.scheduled.append, clock=self.clock, rng=random.Random(3)),
        )

    async def handle(self, fields: dict[bytes, bytes], times: int = 1) -> None:
        await self.deliverer.handle(SHARD, ("1-0", fields), times)

    async def handle_delivery(self, d: Delivery) -> None:
        await self.handle({b"delivery": d.pack()})


@pytest.fixture
async def rig() -> Rig:
    return Rig(webhook_per_target=2, webhook_breaker_failures=2, webhook_breaker_cooldown_s=30)


# --- the first attempt needs no job record -------------------------------------------------------


async def test_a_first_attempt_is_built_from_the_entrys_record_not_the_job_record(
    rig: Rig,
) -> None:
    """The job record (TTL INFERQ_RESULT_TTL_S) is gone: the entry's own record is enough."""
    job = _job()
    assert await rig.redis.exists(keys.job(job.id)) == 0
    await rig.handle({b"job": job.id.encode(), b"record": _record(job)})
    (req,) = rig.receiver.requests
    assert req.content == body_of(job) and json.loads(req.content)["id"] == job.id
    assert rig.settled.last == ("done", (), "acme")  # counted down: the tenant's


async def test_an_entry_of_an_older_version_reads_the_job_record_and_is_not_counted(
    rig: Rig,
) -> None:
    job = _job()
    fields = encode_submit(job) | encode_final(job.status, finished_ms=1_030, outputs=job.outputs)
    await rig.redis.hset(keys.job(job.id), mapping=fields)  # type: ignore[arg-type]
    await rig.handle({b"job": job.id.encode()})  # FINISH of old: no record, no count up
    assert len(rig.receiver.requests) == 1
    assert rig.settled.last == ("done", (), None)
    await rig.redis.delete(keys.job(job.id))
    await rig.handle({b"job": job.id.encode()})
    mode, (_, job_id, _, reason), tenant = rig.settled.calls[-1]
    assert mode == "dead" and job_id == job.id and "expired" in reason and tenant is None


# --- the retry window starts at the first attempt ---------------------------------------------


async def test_the_deadline_counts_from_the_first_attempt_not_from_the_jobs_end() -> None:
    """A job that ended two days ago and waited in a backlog still gets its max age of
    retries from its first attempt on."""
    rig = Rig(webhook_max_age_s=60, webhook_breaker_failures=100)
    rig.receiver.status = 500
    now = now_ms()
    d = Delivery.of(_job(), "1-0", URL)
    young = Delivery(**{**_fields(d), "ended_ms": now - 2 * 86_400_000, "first_ms": now - 1_000})
    await rig.handle_delivery(young)
    mode, (delay_ms, packed), tenant = rig.settled.last
    assert mode == "retry" and 0 < delay_ms <= 60_000 and tenant == "acme"
    assert Delivery.unpack(packed).attempts == 1
    old = Delivery(**{**_fields(d), "first_ms": now - 61_000})
    await rig.handle_delivery(old)
    mode, args, _ = rig.settled.last
    assert mode == "dead" and "INFERQ_WEBHOOK_MAX_AGE_S=60: HTTP 500" in args[3]


def _fields(d: Delivery) -> dict[str, Any]:
    return {name: getattr(d, name) for name in d.__slots__}  # type: ignore[attr-defined]


# --- deferral: a target that cannot take it now costs no slot and no attempt --------------------


async def test_a_delivery_to_a_target_at_its_limit_is_deferred_unattempted(rig: Rig) -> None:
    for _ in range(2):  # both of the target's slots in flight
        assert isinstance(rig.deliverer.targets.admit(target_of(URL), rig.clock()), Ticket)
    d = Delivery.of(_job(), "1-0", URL).failed("HTTP 500")
    await rig.handle_delivery(d)
    assert rig.receiver.requests == []
    mode, (delay_ms, packed), _ = rig.settled.last
    assert mode == "retry" and packed == d.pack()  # attempts and first_ms unchanged
    assert delay_ms >= 100 and rig.scheduled == [delay_ms]  # never a hot loop
    assert rig.metrics.webhook_deferrals.labels(why="busy")._value.get() == 1
    other = Delivery.of(_job("echo.0.j2", "https://8.8.8.8/x"), "2-0", "https://8.8.8.8/x")
    await rig.handle_delivery(other)  # another target is not held up
    assert len(rig.receiver.requests) == 1 and rig.settled.last[0] == "done"


async def test_the_breaker_opens_defers_then_one_probe_closes_it(rig: Rig) -> None:
    rig.receiver.status = REFUSED
    d = Delivery.of(_job(), "1-0", URL)
    for _ in range(2):  # webhook_breaker_failures=2
        await rig.handle_delivery(d)
        assert rig.settled.last[0] == "retry"
    assert len(rig.receiver.requests) == 2
    assert rig.deliverer.targets.state(target_of(URL), rig.clock()) == "open"
    await rig.handle_delivery(d)  # open: deferred for the cooldown, no request
    mode, (delay_ms, packed), _ = rig.settled.last
    assert len(rig.receiver.requests) == 2 and mode == "retry" and packed == d.pack()
    assert 30_000 <= delay_ms <= 30_000 + 2_000 * rig.settings.webhook_timeout_s
    rig.clock.now += 30  # cooldown over: half-open, the next delivery is the probe
    rig.receiver.status = 200
    await rig.handle_delivery(d)
    assert len(rig.receiver.requests) == 3 and rig.settled.last == ("done", (), "acme")
    assert rig.deliverer.targets.state(target_of(URL), rig.clock()) == "closed"


async def test_a_failed_probe_reopens_and_a_delivery_past_its_age_is_not_deferred() -> None:
    rig = Rig(webhook_breaker_failures=1, webhook_breaker_cooldown_s=10, webhook_max_age_s=60)
    rig.receiver.status = REFUSED
    d = Delivery.of(_job(), "1-0", URL)
    await rig.handle_delivery(d)
    rig.clock.now += 10
    await rig.handle_delivery(d)  # the probe fails
    assert len(rig.receiver.requests) == 2
    assert rig.deliverer.targets.state(target_of(URL), rig.clock()) == "open"
    aged = Delivery(**{**_fields(d.failed("ConnectError")), "first_ms": now_ms() - 61_000})
    await rig.handle_delivery(aged)
    mode, args, tenant = rig.settled.last
    assert mode == "dead" and tenant == "acme" and len(rig.receiver.requests) == 2
    assert "INFERQ_WEBHOOK_MAX_AGE_S=60: ConnectError; target https://93.184.216.34:443" in args[3]
    assert "circuit open" in args[3]


async def test_prompt_5xx_answers_never_open_the_breaker_each_delivery_backs_off(rig: Rig) -> None:
    """A receiver answering 500 to the first two attempts of every delivery: each failed
    attempt goes to its delivery's own backoff, the circuit stays closed, so the third
    attempt of each goes out on its schedule (webhook_breaker_failures=2 here)."""
    rig.receiver.status = 500
    deliveries = [Delivery.of(_job(f"echo.0.j{i}"), f"{i}-0", URL) for i in range(5)]
    for attempt in range(2):
        for i, d in enumerate(deliveries):
            await rig.handle_delivery(d)
            mode, (delay_ms, packed), _ = rig.settled.last
            assert mode == "retry" and Delivery.unpack(packed).attempts == attempt + 1
            deliveries[i] = Delivery.unpack(packed)
            # the delivery's backoff (1 s base, doubling, equal jitter), never a cooldown
            assert 500 * 2**attempt <= delay_ms <= 1000 * 2**attempt
        assert rig.deliverer.targets.state(target_of(URL), rig.clock()) == "closed"
    assert rig.metrics.webhook_deferrals.labels(why="open")._value.get() == 0
    rig.receiver.status = 200
    for d in deliveries:
        await rig.handle_delivery(d)
        assert rig.settled.last == ("done", (), "acme")
    assert len(rig.receiver.requests) == 15  # 5 deliveries x 3 attempts, none deferred


# --- SETTLE's keys: the tenant's counter only when settled for good ----------------------------


class _Script:
    def __init__(self) -> None:
        self.keys: list[list[str]] = []

    async def __call__(self, keys: list[str], args: list[object]) -> int:
        self.keys.append(keys)
        return 1


class _Registers:
    def __init__(self) -> None:
        self.scripts: list[_Script] = []

    def register_script(self, body: str) -> _Script:
        self.scripts.append(_Script())
        return self.scripts[-1]


async def test_settle_names_the_tenants_counter_when_settling_for_good_only() -> None:
    redis = _Registers()
    scripts = store.Scripts(redis)  # type: ignore[arg-type]
    settle = redis.scripts[0]
    base = [SHARD.stream, SHARD.retry, SHARD.dead]
    counter = keys.tenant_webhooks("echo", 0, 1, "acme")
    await scripts.settle(SHARD, "me", "1-0", "done", tenant="acme")
    await scripts.settle(SHARD, "me", "1-0", "dead", 10, "j", b"r", "why", tenant="acme")
    await scripts.settle(SHARD, "me", "1-0", "retry", 10, b"r", tenant="acme")
    await scripts.settle(SHARD, "me", "1-0", "done")  # never counted
    assert settle.keys == [[*base, counter], [*base, counter], base, base]


# --- the loops outlive any error ----------------------------------------------------------------


async def _until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _errors(metrics: ApiMetrics, loop: str) -> float:
    return float(metrics.background_errors.labels(loop=loop)._value.get())


async def test_both_loops_survive_any_error_count_it_and_go_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings()
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeAsyncRedis(server=server)
    metrics = api_metrics()
    dispatcher = Dispatcher(
        settings,
        JobQueue(redis, result_ttl_s=60),
        fakeredis.FakeAsyncRedis(server=server),
        metrics,
        poster=Poster(settings, transport=httpx.MockTransport(Receiver())),
    )
    reads: list[int] = []
    promotes: list[int] = []

    async def read(n: int) -> list[Any]:
        reads.append(n)
        if len(reads) == 1:
            raise KeyError("a bug, not Redis")
        await asyncio.sleep(0.02)  # what BLOCK does on an empty stream
        return []

    async def promote(keys: list[str], args: list[object]) -> list[int]:
        promotes.append(1)
        if len(promotes) == 1:
            raise ZeroDivisionError("another bug")
        return [0, -1]

    monkeypatch.setattr(dispatcher.reader, "read", read)
    monkeypatch.setattr(dispatcher.scripts, "_promote", promote)
    dispatcher.start()
    try:
        await _until(lambda: len(reads) >= 3 and len(promotes) >= 2)
    finally:
        await dispatcher.stop()
    assert _errors(metrics, "webhooks_read") == 1
    assert _errors(metrics, "webhooks_upkeep") == 1
    assert "webhooks_read failed" in caplog.text and "webhooks_upkeep failed" in caplog.text
    assert "ended before stop" not in caplog.text
